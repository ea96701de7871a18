// Frame player for the simulated cluster: a Verilator C++ testbench with no Python in the loop.
//
// wirereduce.sim.engines.fastsim writes a *script* (the frames every host sends, each with the
// condition under which it may start) and this program plays it on the host ports of
// wirereduce_net, one clock cycle at a time, recording every frame the nodes send their hosts
// with the cycle of its first and last beat. The protocol logic (building frames, checking
// results) stays in Python, in the host driver; this file only moves beats.
//
// Script (little-endian):
//   u32 magic 'WRS4', u32 nodes, u32 bytes_per_beat, u32 rx_valid_ppm, u32 tx_ready_ppm,
//   u64 seed, u64 deadline_cycles, u64 answer_cycles, u64 progress_every, u32 flip_link, u32 flip_block
//   per node: u32 n_frames, u32 expect_frames, u64 late_cycles
//     per frame: u32 len, u32 own_gate, u32 all_gate, len bytes
//   A frame may put its first beat on the bus once its own host has received own_gate frames
//   and every host has received all_gate frames (the driver's window and start barrier).
//   own_gate = STALL_GATE marks a frame sent only if the run stalls: when the hosts still miss
//   frames at cycle deadline_cycles (the round's deadline, sim/engines/fastengine.py), the
//   player sends those frames (the driver's STATS_REQUESTs) and runs until each host has received
//   one more frame per such request, or no host port has moved a beat for answer_cycles.
//   flip_link, flip_block drive the network's fault-injection inputs (links="eth" or "cmac", FLIP defined).
//   late_cycles holds the host's frames that wait for every host (all_gate > 0: its pushes)
//   until late_cycles after the start barrier (every host has its first frame's answer): a
//   host that starts late; the deadline moves by the latest host's late_cycles.
// Result file:
//   u32 magic 'WRR1', u64 cycles, u32 status (0 done, 1 timeout)
//   per node: u32 n_sent, n_sent × (u64 first_cycle, u64 last_cycle),
//             u32 n_received, n_received × (u32 len, u64 first_cycle, u64 last_cycle, len bytes)
//
// tb_config.h, written by fastsim.py next to this file, defines NODES, BYTES_PER_BEAT and PORTS
// (one HOST(k) per node): the per-port code below is expanded once per host port. It defines TAP
// when the network has a capture tap (tap_t{data,keep,last,valid}, links="eth"); given a third
// argument, the player then writes every tapped frame there: u32 len, u64 first_cycle, len bytes.

#include "tb_config.h"
#include "Vwirereduce_net.h"
#include "verilated.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <climits>
#include <memory>
#include <vector>

namespace {

constexpr uint32_t STALL_GATE = 0xFFFFFFFFu;

struct Frame {
    std::vector<uint8_t> bytes;
    uint32_t own_gate = 0, all_gate = 0;
};

struct Received {
    std::vector<uint8_t> bytes;
    uint64_t first = 0, last = 0;
};

struct Host {
    std::vector<Frame> script;
    uint32_t expect = 0;
    uint64_t late = 0;     // cycles after the start barrier before its pushes may start
    uint32_t on_stall = 0;  // frames sent only once the run stalls (at the end of the script)
    // transmit side (host -> node)
    size_t frame = 0, offset = 0;
    bool holding = false;  // valid is up and must stay up until the beat is taken
    std::vector<uint64_t> sent_first, sent_last;
    // receive side (node -> host)
    std::vector<Received> received;
    std::vector<uint8_t> partial;
    uint64_t partial_first = 0;
    bool in_frame = false;
    bool ready = false;
};

// xorshift64*: a fixed, seeded stream so a back-pressure pattern is the same every run.
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed ? seed : 0x9E3779B97F4A7C15ull) {}
    uint32_t ppm() {
        s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
        return static_cast<uint32_t>((s * 0x2545F4914F6CDD1Dull) >> 32) % 1000000u;
    }
};

template <typename T> T read_le(FILE* f) {
    T v{};
    if (fread(&v, sizeof v, 1, f) != 1) { fprintf(stderr, "tb: script truncated\n"); exit(2); }
    return v;
}
template <typename T> void write_le(FILE* f, T v) { fwrite(&v, sizeof v, 1, f); }

// Data buses up to 64 bits are plain integers in Verilator; wider ones are VlWide arrays.
inline void put_bus(QData& s, const uint8_t* p, size_t n) { uint64_t v = 0; memcpy(&v, p, n); s = v; }
inline void put_bus(IData& s, const uint8_t* p, size_t n) { uint32_t v = 0; memcpy(&v, p, n); s = v; }
template <std::size_t W> void put_bus(VlWide<W>& s, const uint8_t* p, size_t n) {
    uint32_t buf[W] = {0};
    memcpy(buf, p, n);
    for (std::size_t i = 0; i < W; ++i) s[i] = buf[i];
}
inline void get_bus(const QData& s, uint8_t* p, size_t n) { uint64_t v = s; memcpy(p, &v, n); }
inline void get_bus(const IData& s, uint8_t* p, size_t n) { uint32_t v = s; memcpy(p, &v, n); }
template <std::size_t W> void get_bus(const VlWide<W>& s, uint8_t* p, size_t n) {
    uint32_t buf[W];
    for (std::size_t i = 0; i < W; ++i) buf[i] = s[i];
    memcpy(p, buf, n);
}
inline uint64_t keep_mask(size_t n) { return n >= 64 ? ~0ull : ((1ull << n) - 1); }

unsigned bytes_in_keep(uint64_t keep) { return static_cast<unsigned>(__builtin_popcountll(keep)); }

}  // namespace

// Per-cycle drive and sample of one host port pair; templated on Verilator's signal types.
template <typename D, typename K>
void drive(Host& h, Rng& rng, uint32_t rx_ppm, uint32_t tx_ppm, unsigned bpb, bool may_start,
           CData& valid, D& data, K& keep, CData& last, CData& tx_ready) {
    if (!h.holding && h.frame < h.script.size() && (h.offset > 0 || may_start)) {
        if (rx_ppm >= 1000000u || rng.ppm() < rx_ppm) h.holding = true;
    }
    if (h.holding) {
        const Frame& f = h.script[h.frame];
        size_t n = f.bytes.size() - h.offset;
        if (n > bpb) n = bpb;
        put_bus(data, f.bytes.data() + h.offset, n);
        keep = static_cast<K>(keep_mask(n));
        last = h.offset + n >= f.bytes.size();
        valid = 1;
    } else {
        valid = 0;
    }
    h.ready = tx_ppm >= 1000000u || rng.ppm() < tx_ppm;
    tx_ready = h.ready;
}

template <typename D, typename K>
bool sample(Host& h, unsigned bpb, uint64_t cycle, CData rx_valid, CData rx_ready, CData tx_valid,
            const D& data, const K& keep, CData tx_last, bool& rx_fire) {
    rx_fire = rx_valid && rx_ready;
    bool any = rx_fire;
    if (tx_valid && h.ready) {
        any = true;
        uint8_t buf[256];
        unsigned n = bytes_in_keep(static_cast<uint64_t>(keep));
        get_bus(data, buf, bpb);
        if (!h.in_frame) { h.in_frame = true; h.partial.clear(); h.partial_first = cycle; }
        h.partial.insert(h.partial.end(), buf, buf + n);
        if (tx_last) {
            h.received.push_back({h.partial, h.partial_first, cycle});
            h.in_frame = false;
        }
    }
    return any;
}

void advance(Host& h, unsigned bpb, uint64_t cycle, bool rx_fire) {
    if (!rx_fire) return;
    const Frame& f = h.script[h.frame];
    if (h.offset == 0) h.sent_first.push_back(cycle);
    h.offset += bpb;
    h.holding = false;
    if (h.offset >= f.bytes.size()) {
        h.sent_last.push_back(cycle);
        h.offset = 0;
        ++h.frame;
    }
}

int main(int argc, char** argv) {
    if (argc != 3 && argc != 4) { fprintf(stderr, "usage: %s SCRIPT RESULT [TAP]\n", argv[0]); return 2; }
    FILE* tap_out = nullptr;
#ifdef TAP
    std::vector<uint8_t> tap_frame;
    uint64_t tap_first = 0;
    if (argc == 4) {
        tap_out = fopen(argv[3], "wb");
        if (!tap_out) { perror(argv[3]); return 2; }
    }
#else
    if (argc == 4) { fprintf(stderr, "tb: this network has no capture tap (links=\"eth\" only)\n"); return 2; }
#endif
    FILE* in = fopen(argv[1], "rb");
    if (!in) { perror(argv[1]); return 2; }
    if (read_le<uint32_t>(in) != 0x34535257u) { fprintf(stderr, "tb: not a WRS4 script\n"); return 2; }
    const uint32_t nodes = read_le<uint32_t>(in);
    const uint32_t bpb = read_le<uint32_t>(in);
    const uint32_t rx_ppm = read_le<uint32_t>(in);
    const uint32_t tx_ppm = read_le<uint32_t>(in);
    Rng rng(read_le<uint64_t>(in));
    const uint64_t deadline = read_le<uint64_t>(in);
    const uint64_t answer_wait = read_le<uint64_t>(in);
    const uint64_t progress_every = read_le<uint64_t>(in);
    const uint32_t flip_link = read_le<uint32_t>(in);
    const uint32_t flip_block = read_le<uint32_t>(in);
    if (nodes != NODES || bpb != BYTES_PER_BEAT) {
        fprintf(stderr, "tb: script is for %u nodes, %u bytes a beat; this build is %u, %u\n", nodes, bpb,
                NODES, BYTES_PER_BEAT);
        return 2;
    }
    std::vector<Host> hosts(nodes);
    for (auto& h : hosts) {
        uint32_t n = read_le<uint32_t>(in);
        h.expect = read_le<uint32_t>(in);
        h.late = read_le<uint64_t>(in);
        h.script.resize(n);
        for (auto& f : h.script) {
            uint32_t len = read_le<uint32_t>(in);
            f.own_gate = read_le<uint32_t>(in);
            f.all_gate = read_le<uint32_t>(in);
            if (f.own_gate == STALL_GATE) ++h.on_stall;
            f.bytes.resize(len);
            if (len && fread(f.bytes.data(), 1, len, in) != len) { fprintf(stderr, "tb: script truncated\n"); return 2; }
        }
    }
    fclose(in);

    auto ctx = std::make_unique<VerilatedContext>();
    ctx->commandArgs(argc, argv);
    auto top = std::make_unique<Vwirereduce_net>(ctx.get());
    // The model resets itself on its first RESET_CYCLES rising edges (fastsim.internal_reset).
    top->clk = 0;
    for (int i = 0; i < RESET_CYCLES; ++i) { top->clk = 0; top->eval(); top->clk = 1; top->eval(); }
#ifdef FLIP
    top->flip_link = flip_link;
    top->flip_block = flip_block;
#else
    if (flip_block) { fprintf(stderr, "tb: this network has no fault injection (links=\"eth\" or \"cmac\" only)\n"); return 2; }
    (void)flip_link;
#endif

    uint64_t cycle = 0, idle = 0;
    uint64_t barrier = UINT64_MAX;  // first cycle at which every host had an answer
    uint64_t latest = 0;
    for (auto& h : hosts) latest = std::max(latest, h.late);
    uint32_t status = 0;
    bool stalled = false;
    std::vector<size_t> stall_expect(nodes, 0);
    bool rx_fire[NODES];
    for (;;) {
        size_t least = SIZE_MAX;
        bool done = true;
        for (uint32_t k = 0; k < nodes; ++k) {
            const Host& h = hosts[k];
            least = std::min(least, h.received.size());
            done = done && h.received.size() >= (stalled ? stall_expect[k] : h.expect);
        }
        if (done) break;
        if (barrier == UINT64_MAX && least >= 1) barrier = cycle;
        if (stalled ? idle > answer_wait : cycle > deadline + latest) {
            status = 1;
            bool any_stall_frames = false;
            for (auto& h : hosts) any_stall_frames = any_stall_frames || h.on_stall;
            if (stalled || !any_stall_frames) break;
            // The run stalled: skip to the stall frames and wait for their answers.
            stalled = true;
            idle = 0;
            for (uint32_t k = 0; k < nodes; ++k) stall_expect[k] = hosts[k].received.size() + hosts[k].on_stall;
        }
        if (stalled) {  // once a frame in flight has gone, skip what is left of the script
            for (auto& h : hosts) {
                size_t first_stall = h.script.size() - h.on_stall;
                if (h.offset == 0 && !h.holding && h.frame < first_stall) h.frame = first_stall;
            }
        }
#define HOST(k)                                                                                      \
    {                                                                                                \
        Host& h = hosts[k];                                                                          \
        bool ok = h.frame < h.script.size() &&                                                       \
                  (h.script[h.frame].own_gate == STALL_GATE                                          \
                       ? stalled                                                                     \
                       : h.received.size() >= h.script[h.frame].own_gate &&                          \
                             least >= h.script[h.frame].all_gate &&                                  \
                             (h.script[h.frame].all_gate == 0 || cycle >= barrier + h.late));       \
        drive(h, rng, rx_ppm, tx_ppm, bpb, ok, top->host##k##_rx_tvalid, top->host##k##_rx_tdata,    \
              top->host##k##_rx_tkeep, top->host##k##_rx_tlast, top->host##k##_tx_tready);           \
    }
        PORTS
#undef HOST
        top->clk = 0;
        top->eval();
        bool any = false;
#define HOST(k)                                                                                      \
    any |= sample(hosts[k], bpb, cycle, top->host##k##_rx_tvalid, top->host##k##_rx_tready,         \
                  top->host##k##_tx_tvalid, top->host##k##_tx_tdata, top->host##k##_tx_tkeep,        \
                  top->host##k##_tx_tlast, rx_fire[k]);
        PORTS
#undef HOST
#ifdef TAP
        if (tap_out && top->tap_tvalid) {
            uint8_t buf[8];
            get_bus(top->tap_tdata, buf, 8);
            if (tap_frame.empty()) tap_first = cycle;
            tap_frame.insert(tap_frame.end(), buf, buf + bytes_in_keep(top->tap_tkeep));
            if (top->tap_tlast) {
                write_le<uint32_t>(tap_out, static_cast<uint32_t>(tap_frame.size()));
                write_le<uint64_t>(tap_out, tap_first);
                fwrite(tap_frame.data(), 1, tap_frame.size(), tap_out);
                tap_frame.clear();
            }
        }
#endif
        top->clk = 1;
        top->eval();
        for (uint32_t k = 0; k < nodes; ++k) advance(hosts[k], bpb, cycle, rx_fire[k]);
        idle = any ? 0 : idle + 1;
        ++cycle;
        if (progress_every && cycle % progress_every == 0) {
            size_t got = 0;
            for (auto& h : hosts) got += h.received.size();
            printf("P %llu %zu\n", static_cast<unsigned long long>(cycle), got);
            fflush(stdout);
        }
    }
    top->final();
    if (tap_out) fclose(tap_out);

    FILE* out = fopen(argv[2], "wb");
    if (!out) { perror(argv[2]); return 2; }
    write_le<uint32_t>(out, 0x31525257u);
    write_le<uint64_t>(out, cycle);
    write_le<uint32_t>(out, status);
    for (auto& h : hosts) {
        write_le<uint32_t>(out, static_cast<uint32_t>(h.sent_first.size()));
        for (size_t i = 0; i < h.sent_first.size(); ++i) {
            write_le<uint64_t>(out, h.sent_first[i]);
            write_le<uint64_t>(out, i < h.sent_last.size() ? h.sent_last[i] : 0);
        }
        write_le<uint32_t>(out, static_cast<uint32_t>(h.received.size()));
        for (auto& r : h.received) {
            write_le<uint32_t>(out, static_cast<uint32_t>(r.bytes.size()));
            write_le<uint64_t>(out, r.first);
            write_le<uint64_t>(out, r.last);
            fwrite(r.bytes.data(), 1, r.bytes.size(), out);
        }
    }
    fclose(out);
    printf("E %llu %u\n", static_cast<unsigned long long>(cycle), status);
    return 0;
}
