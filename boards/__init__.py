"""Board platforms and tops (VC709, 100G UltraScale+): not written yet, see the README."""
