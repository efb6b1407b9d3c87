// OpenBLAS's kernel core, corrected at load when OpenBLAS does not know this CPU.
//
// A DYNAMIC_ARCH OpenBLAS (what Debian and most distributions ship) picks its kernels from the
// CPU's model number. One older than the CPU does not know the model and takes a generic core:
// OpenBLAS 0.3.21 (Debian 12) on an Emerald Rapids Xeon (family 6, model 0xCF) ran sgemm at about
// 11 GFLOP/s per core, a tenth of what its AVX-512 kernels do there (docs/perf.md). So when this
// library loads (after OpenBLAS, which it links), it compares OpenBLAS's choice with the ISA
// level CPUID reports (isa.cpp) and, when the CPU runs a stronger core, re-selects it through
// OpenBLAS's own path: gotoblas_dynamic_quit() then gotoblas_dynamic_init(), which reads
// OPENBLAS_CORETYPE. A user who set OPENBLAS_CORETYPE keeps their choice, and a core we do not
// rank (another vendor's, a newer one) is left alone.
#include <strings.h>

#include <cstdlib>
#include <string>

#include "blas_core.hpp"
#include "isa.hpp"
#include "ulysses/kernels/attention.hpp"

// Weak: an OpenBLAS built for one core (no DYNAMIC_ARCH) has no re-selection to offer.
extern "C" {
char* openblas_get_corename(void);
__attribute__((weak)) void gotoblas_dynamic_init(void);
__attribute__((weak)) void gotoblas_dynamic_quit(void);
}

namespace ulysses {

namespace {

// 1: pre-AVX2 generic cores; 2: AVX2 + FMA; 3: AVX-512. 0: not ranked here (left alone).
int rank(const char* core) {
  static const char* const kGeneric[] = {"Prescott",    "Core2",  "Penryn",     "Dunnington", "Nehalem", "Atom",
                                         "Sandybridge", "Katmai", "Coppermine", "Northwood",  "Banias",  "unknown"};
  for (const char* name : kGeneric)
    if (strcasecmp(core, name) == 0) return 1;
  if (strcasecmp(core, "Haswell") == 0) return 2;
  if (strcasecmp(core, "SkylakeX") == 0 || strcasecmp(core, "Cooperlake") == 0 ||
      strcasecmp(core, "SapphireRapids") == 0)
    return 3;
  return 0;
}

struct Core {
  std::string name, chose;  // chose: OpenBLAS's own choice when it was replaced, else empty
};

Core select_core() {
  const std::string chose = openblas_get_corename();
  const kernels::Isa isa = kernels::best_supported_isa();
  const char* want = isa >= kernels::Isa::avx512 ? "SkylakeX" : isa == kernels::Isa::avx2 ? "Haswell" : nullptr;
  const int have = rank(chose.c_str());
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || want == nullptr || have == 0 || have >= rank(want) ||
      gotoblas_dynamic_init == nullptr)
    return {chose, ""};
  return {kernels::reselect_blas_core(want), chose};
}

const Core& core() {
  static const Core c = select_core();
  return c;
}

// Before main() and before any GEMM: the re-selection must not race a running BLAS call.
const bool g_selected_at_load = (core(), true);

}  // namespace

namespace kernels {

std::string reselect_blas_core(const char* name) {
  if (gotoblas_dynamic_init == nullptr || gotoblas_dynamic_quit == nullptr) return openblas_get_corename();
  setenv("OPENBLAS_CORETYPE", name, 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");  // children (mpirun's, a shell's) decide for themselves
  return openblas_get_corename();
}

}  // namespace kernels

std::string blas_core() {
  const Core& c = core();
  return c.chose.empty() ? c.name : c.name + " (re-selected at load; OpenBLAS chose " + c.chose + ")";
}

}  // namespace ulysses
