// The balancer's policies (balancer.hpp). `static` is today's DP × CP: fixed groups of
// world / dp ranks, sequences dealt round-robin.
#include "ulysses/balancer.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "ulysses/error.hpp"

namespace ulysses {

const char* policy_name(BalancePolicy p) {
  switch (p) {
    case BalancePolicy::static_: return "static";
    case BalancePolicy::pow2: return "pow2";
    case BalancePolicy::dynamic: return "dynamic";
  }
  return "?";
}

BalancePolicy parse_policy(const std::string& text) {
  for (BalancePolicy p : {BalancePolicy::static_, BalancePolicy::pow2, BalancePolicy::dynamic})
    if (text == policy_name(p)) return p;
  throw Error(fmt::format("balance policy '{}': expected static, pow2 or dynamic", text));
}

std::vector<int> BalancePlan::sequences_of(int rank) const {
  std::vector<int> mine;
  for (int i = 0; i < int(groups.size()); ++i)
    if (groups[std::size_t(i)].contains(rank)) mine.push_back(i);
  return mine;
}

namespace {

void check_input(const BalanceInput& in) {
  if (in.lengths.empty()) throw Error("balance: the step has no sequences");
  if (in.world < 1) throw Error(fmt::format("balance: world must be >= 1, got {}", in.world));
  if (in.dp < 1 || in.world % in.dp != 0)
    throw Error(fmt::format("balance: dp {} does not divide the world size {}", in.dp, in.world));
  for (std::size_t i = 0; i < in.lengths.size(); ++i)
    if (in.lengths[i] < 1) throw Error(fmt::format("balance: sequence {} has length {} (must be >= 1)", i, in.lengths[i]));
}

BalancePlan static_plan(const BalanceInput& in) {
  BalancePlan plan;
  plan.policy = BalancePolicy::static_;
  const int cp = in.world / in.dp;
  for (std::size_t i = 0; i < in.lengths.size(); ++i)
    plan.groups.push_back({int(i % std::size_t(in.dp)) * cp, cp});
  plan.rank_seconds.assign(std::size_t(in.world), 0.0);
  plan.rank_memory.assign(std::size_t(in.world), 0.0);
  return plan;
}

}  // namespace

BalancePlan balance(const BalanceInput& in, BalancePolicy policy) {
  check_input(in);
  if (policy != BalancePolicy::static_)
    throw Error(fmt::format("balance: policy {} is not implemented yet", policy_name(policy)));
  return static_plan(in);
}

}  // namespace ulysses
