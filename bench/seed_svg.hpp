// Minimal hand-written SVG for the seed section's plots (as `ulysses plan --svg` draws its own):
// line charts, bar groups, and a per-rank timeline drawn from a Chrome trace.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace ulysses::seed {

struct Series {
  std::string name;
  std::vector<double> x, y;  // points with y <= 0 are skipped (invalid configurations)
};
// Lines over x (log2 axis), y on a log10 axis when log_y.
std::string svg_lines(const std::string& title, const std::string& x_label, const std::string& y_label,
                      const std::vector<Series>& series, bool log_y);

struct BarGroup {
  std::string name;            // under the group
  std::vector<double> values;  // one bar each (a rank)
};
std::string svg_bars(const std::string& title, const std::string& y_label, const std::vector<BarGroup>& groups);

// One row per track (pid) of a Chrome trace's complete events, coloured by category;
// "phase" events as thin bars above their rank's row.
std::string svg_timeline(const std::string& title, const nlohmann::json& trace);

}  // namespace ulysses::seed
