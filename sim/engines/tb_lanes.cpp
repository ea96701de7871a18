// Verilator testbench of the reduce lanes (wirereduce.hdl.arith.lanes.ReduceLanes): streams operand
// rows from a file through the design, one row per clock with `en` held high, and writes the
// result rows. No Python in the loop; wirereduce.sim.engines.lanesim writes the input and reads
// the output.
//
// Input file (little-endian):
//   u32 magic 'WRL1', u32 lanes, u64 rows
//   per row: u32 mode (the dtype byte, bits 0-7), lanes × u32 a, lanes × u32 b
// Output file:
//   u32 magic 'WRO1', u32 lanes, u64 rows
//   per row: lanes × u32 s (the result of that row's a and b)
//
// The lanes' format selects are registered from `mode` every clock and must not change while
// operands are in flight: when a row's mode differs from the previous row's, the pipeline is
// drained first (its results collected), then the new mode is applied and given two clocks to
// settle before the row enters.
//
// lanes_config.h, written by lanesim.py next to this file, defines LANES and LATENCY.

#include "lanes_config.h"
#include "Vreduce_lanes.h"
#include "verilated.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

namespace {

constexpr uint32_t MAGIC_IN = 0x314C5257u;   // 'WRL1'
constexpr uint32_t MAGIC_OUT = 0x314F5257u;  // 'WRO1'
constexpr size_t ROW_WORDS = 1 + 2 * LANES;
constexpr size_t CHUNK = 1 << 16;            // rows read per fread

[[noreturn]] void die(const char* msg) {
    std::fprintf(stderr, "tb_lanes: %s\n", msg);
    std::exit(2);
}

// 32 · LANES-bit buses: a plain integer up to 64 bits, a VlWide array above.
template <typename T> void put(T& s, const uint32_t* w) {
    if constexpr (sizeof(T) <= 4) {
        s = w[0];
    } else if constexpr (sizeof(T) <= 8) {
        s = static_cast<uint64_t>(w[0]) | static_cast<uint64_t>(w[1]) << 32;
    } else {
        for (size_t i = 0; i < LANES; ++i) s[i] = w[i];
    }
}

template <typename T> void get(const T& s, uint32_t* w) {
    if constexpr (sizeof(T) <= 4) {
        w[0] = s;
    } else if constexpr (sizeof(T) <= 8) {
        w[0] = static_cast<uint32_t>(s);
        w[1] = static_cast<uint32_t>(static_cast<uint64_t>(s) >> 32);
    } else {
        for (size_t i = 0; i < LANES; ++i) w[i] = s[i];
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) die("usage: Vtb INPUT OUTPUT");
    FILE* in = std::fopen(argv[1], "rb");
    if (!in) die("cannot open the input file");
    FILE* out = std::fopen(argv[2], "wb");
    if (!out) die("cannot open the output file");
    uint32_t head[2];
    uint64_t rows = 0;
    if (std::fread(head, 4, 2, in) != 2 || std::fread(&rows, 8, 1, in) != 1) die("short header");
    if (head[0] != MAGIC_IN) die("bad magic");
    if (head[1] != LANES) die("lanes in the file differ from the model's");
    uint32_t ohead[2] = {MAGIC_OUT, LANES};
    std::fwrite(ohead, 4, 2, out);
    std::fwrite(&rows, 8, 1, out);

    auto ctx = std::make_unique<VerilatedContext>();
    auto dut = std::make_unique<Vreduce_lanes>(ctx.get());
    auto tick = [&]() {
        dut->clk = 0;
        dut->eval();
        dut->clk = 1;
        dut->eval();
    };
    dut->rst = 1;
    dut->en = 0;
    dut->mode = 0x01;
    tick();
    tick();
    dut->rst = 0;

    std::vector<uint32_t> buf(CHUNK * ROW_WORDS);
    std::vector<uint32_t> obuf;
    obuf.reserve(CHUNK * LANES);
    const uint32_t zeros[LANES] = {0};
    uint32_t res[LANES];
    uint64_t written = 0;
    auto flush = [&]() {
        if (!obuf.empty() && std::fwrite(obuf.data(), 4, obuf.size(), out) != obuf.size()) die("write failed");
        written += obuf.size() / LANES;
        obuf.clear();
    };
    // One enabled clock: a row enters (real: from the file; else a filler whose result is dropped),
    // and once LATENCY rows have entered, s holds the result of the oldest row in flight.
    std::deque<bool> in_flight;
    size_t real_in_flight = 0;
    // (Operands are set after the falling edge's eval, so the logic they feed is evaluated once
    // per cycle, not twice: 20 % faster.)
    auto step = [&](const uint32_t* a, const uint32_t* b, bool real) {
        dut->clk = 0;
        dut->eval();
        put(dut->a, a);
        put(dut->b, b);
        dut->en = 1;
        dut->clk = 1;
        dut->eval();
        in_flight.push_back(real);
        real_in_flight += real;
        if (in_flight.size() >= LATENCY) {
            if (in_flight.front()) {
                get(dut->s, res);
                obuf.insert(obuf.end(), res, res + LANES);
                --real_in_flight;
            }
            in_flight.pop_front();
        }
    };
    auto drain = [&]() {
        while (real_in_flight) step(zeros, zeros, false);
        in_flight.clear();
    };

    uint32_t cur_mode = 0x100;  // none yet
    uint64_t done = 0;
    while (done < rows) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(CHUNK, rows - done));
        if (std::fread(buf.data(), 4, n * ROW_WORDS, in) != n * ROW_WORDS) die("short input");
        for (size_t i = 0; i < n; ++i) {
            const uint32_t* row = buf.data() + i * ROW_WORDS;
            uint32_t mode = row[0] & 0xFF;
            if (mode != cur_mode) {
                drain();           // under the old mode
                dut->mode = mode;  // then let the registered selects take the new one
                dut->en = 0;
                tick();
                tick();
                cur_mode = mode;
            }
            step(row + 1, row + 1 + LANES, true);
        }
        done += n;
        flush();
    }
    drain();
    flush();
    if (written != rows) die("internal: result count differs from row count");
    if (std::fclose(out) != 0) die("close failed");
    std::fclose(in);
    dut->final();
    return 0;
}
