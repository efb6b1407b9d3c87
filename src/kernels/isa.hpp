// Instruction-set levels of the CPU kernels, chosen once at start-up from CPUID.
//
//   amx      AVX-512 float32 kernels + AMX tiles for bfloat16 (Sapphire Rapids and later)
//   avx512   AVX-512 (F, BW, VL, DQ) float32 kernels; bf16 on vdpbf16ps where the CPU has
//            AVX512_BF16 and it outruns the float32 FMA (Zen 4: 2x the FLOPs), else
//            converted to float32 (Intel without AMX enabled: vdpbf16ps runs at half the
//            FMA's FLOP rate there, so the FMA is the faster unit for bf16 inputs)
//   avx2     AVX2 + FMA float32 kernels; bf16 converted
//   portable OpenBLAS tile GEMMs and a scalar exp; bf16 converted
//
// The best level the CPU *and the OS* support is used (AVX-512 needs the ZMM state enabled in
// XCR0; AMX needs the tile state in XCR0 and Linux's per-process permission,
// arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)). ULYSSES_MAX_ISA=<level> caps it
// (like oneDNN's ONEDNN_MAX_CPU_ISA), and tests force each supported level in turn.
#pragma once

#include <cstdint>
#include <vector>

#include "engine.hpp"

namespace ulysses::kernels {

enum class Isa { portable = 0, avx2 = 1, avx512 = 2, amx = 3 };

const char* to_string(Isa isa);
bool parse_isa(const char* name, Isa* out);  // false on an unknown name

Isa best_supported_isa();           // what this CPU and OS can run
std::vector<Isa> supported_isas();  // portable … best_supported_isa()
Isa active_isa();
// Use `isa` from now on (clamped to what the CPU supports); returns the level in use.
Isa force_isa(Isa isa);

// Whether the CPU (and OS) can run AVX512_BF16 instructions, and whether its vdpbf16ps does
// more FLOPs per second than its float32 FMA: the avx512 level's bf16 engine and the
// trainer's bf16 GEMMs use the dot product only then (isa.cpp says how it is decided).
bool cpu_has_avx512_bf16();
bool bf16_dot_outruns_fma();
// How far ahead of its reads the decode kernel asks for each stream's lines (decode_rows_body.hpp):
// a kilobyte, or a block of rows. By vendor, never timed; the distance changes no bits, and
// tests force each in turn.
enum class DecodePrefetch { kilobyte = 0, block = 1 };
DecodePrefetch decode_prefetch();
DecodePrefetch force_decode_prefetch(DecodePrefetch distance);  // returns the one it replaced
// Whether a call whose KV heads each serve `group` query heads prefetches a block ahead.
bool decode_prefetches_block(std::int64_t group);

// The table of a level, and of the active one.
const KernelLevel& level(Isa isa);
const KernelLevel& active_level();

// Tests: every kernel runs on `level` (a table of their own, such as the emulated AVX512_BF16
// one, so the strategies' bf16 paths meet a bf16 engine on any CPU) until it is called with
// nullptr, which restores the active ISA's. Call it while no kernel runs.
void use_level_for_testing(const KernelLevel* level);

}  // namespace ulysses::kernels
