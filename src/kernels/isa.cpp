#include "isa.hpp"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "engines.hpp"

namespace ulysses::kernels {

namespace {

constexpr const char* kNames[] = {"portable", "avx2", "avx512", "amx"};

std::uint64_t xcr0() {
  std::uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (std::uint64_t(edx) << 32) | eax;
}

struct Cpuid7 {
  std::uint32_t ebx = 0, edx = 0;
};

Cpuid7 leaf7() {
  Cpuid7 r;
  std::uint32_t a, b, c, d;
  if (__get_cpuid_max(0, nullptr) >= 7 && __get_cpuid_count(7, 0, &a, &b, &c, &d)) r = {b, d};
  return r;
}

bool os_saves_zmm() {
  std::uint32_t a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  return (xcr0() & 0xe6) == 0xe6;                                          // SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
}

bool has_avx512() {
  const Cpuid7 c = leaf7();
  const bool f = c.ebx & (1u << 16), dq = c.ebx & (1u << 17), bw = c.ebx & (1u << 30), vl = c.ebx & (1u << 31);
  return f && dq && bw && vl && os_saves_zmm();
}

// AVX512_BF16: CPUID leaf 7 subleaf 1, EAX bit 5 (the ZMM state is checked with AVX-512).
bool has_avx512_bf16() {
  std::uint32_t a, b, c, d;
  return __get_cpuid_max(0, nullptr) >= 7 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
}

bool amd() {
  std::uint32_t a, b, c, d;
  return __get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163;  // "AuthenticAMD"
}

// AMX-TILE and AMX-BF16 in CPUID, the tile state in XCR0, and Linux's permission to use it.
bool has_amx() {
  const Cpuid7 c = leaf7();
  if (!(c.edx & (1u << 24)) || !(c.edx & (1u << 22))) return false;
  if ((xcr0() & (3u << 17)) != (3u << 17)) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

Isa detect() {
  __builtin_cpu_init();  // this runs from a static initialiser: make sure libgcc's CPU model is set
  Isa best = Isa::portable;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::avx2;
  if (best == Isa::avx2 && has_avx512()) best = Isa::avx512;
  if (best == Isa::avx512 && has_amx()) best = Isa::amx;
  return best;
}

Isa capped(Isa best) {
  Isa cap;
  const char* env = std::getenv("ULYSSES_MAX_ISA");
  return env && parse_isa(env, &cap) && cap < best ? cap : best;
}

// Function-local so that other static initialisers (blas_core.cpp) may ask for it.
Isa best() {
  static const Isa b = detect();
  return b;
}
Isa g_active = capped(best());
const KernelLevel* g_testing = nullptr;

}  // namespace

const char* to_string(Isa isa) { return kNames[int(isa)]; }

bool parse_isa(const char* name, Isa* out) {
  for (int i = 0; i < 4; ++i)
    if (std::strcmp(name, kNames[i]) == 0) return *out = Isa(i), true;
  return false;
}

Isa best_supported_isa() { return best(); }

bool cpu_has_avx512_bf16() { return best() >= Isa::avx512 && has_avx512_bf16(); }

// By vendor, never timed: a timing could differ between runs and ranks, and the two paths
// round P differently, so every process of one machine must make the same choice. Measured
// with the register-resident probe (peak.hpp), one core: AMD Zen 4, vdpbf16ps 236 against the
// FMA's 117 GFLOP/s (2.0x); Intel Emerald Rapids (AMX not enabled) 84 against 170 (0.5x).
bool bf16_dot_outruns_fma() { return cpu_has_avx512_bf16() && amd(); }

// A block on AMD: Zen 5 reads 40 GB/s a core, a kilobyte of it in 26 ns, less than one DRAM
// latency (GQA 8/2 d = 128: 0.68 of the read a kilobyte ahead against 0.86 a block ahead,
// docs/perf.md v50; the kernel takes it only under GQA of four heads a KV head or more,
// decode_forward.cpp). A kilobyte on Intel: Sapphire Rapids reads 16 GB/s a core, and a block
// ahead measured slower there (v38).
namespace {
DecodePrefetch g_decode_prefetch = amd() ? DecodePrefetch::block : DecodePrefetch::kilobyte;
}  // namespace

DecodePrefetch decode_prefetch() { return g_decode_prefetch; }
DecodePrefetch force_decode_prefetch(DecodePrefetch distance) { return std::exchange(g_decode_prefetch, distance); }

// A block ahead only where a KV head serves four query heads or more (a FMA a cached byte or
// more): with fewer, the pass's own work is a third of the read or less and a kilobyte ahead kept
// up (GQA 8/4 d 128: 0.88–0.91 of the read against 0.81–0.84 a block ahead; MHA d 128: 1.00–1.04
// against 0.92–0.95), with four it did not (GQA 8/2 d 128: 0.68 against 0.86; docs/perf.md v50).
bool decode_prefetches_block(std::int64_t group) { return g_decode_prefetch == DecodePrefetch::block && group >= 4; }

std::vector<Isa> supported_isas() {
  std::vector<Isa> v;
  for (int i = 0; i <= int(best()); ++i) v.push_back(Isa(i));
  return v;
}

Isa active_isa() { return g_active; }
Isa force_isa(Isa isa) { return g_active = isa < best() ? isa : best(); }

const KernelLevel& level(Isa isa) {
  using namespace native;
  static const KernelLevel levels[] = {
      {"portable", &blas_f32, nullptr, scalar_vec},
      {"avx2", &avx2_f32, nullptr, avx2_vec},
      {"avx512", &avx512_f32, bf16_dot_outruns_fma() ? &avx512_bf16 : nullptr, avx512_vec},
      {"amx", &avx512_f32, &amx_bf16, avx512_vec},
  };
  return levels[int(isa)];
}

const KernelLevel& active_level() { return g_testing != nullptr ? *g_testing : level(g_active); }

void use_level_for_testing(const KernelLevel* level) { g_testing = level; }

}  // namespace ulysses::kernels
