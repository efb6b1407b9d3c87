#include "agreement.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "ulysses/core/error.hpp"

namespace ulysses::cli {

namespace {

constexpr const char* kInputPrefix = "input:";

// FNV-1a, bytewise: the same 64 bits for the same bytes on every host and build.
std::uint64_t fnv(const char* data, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(data[i])) * 1099511628211ull;
  return h;
}

// The hash of a regular file's contents: all of it up to 64 MiB (what agreement costs stays
// small beside reading the file), else its first and last MiB with its size.
std::string content_key(const std::string& path, std::int64_t size) {
  constexpr std::int64_t kWhole = std::int64_t(64) << 20, kEnds = std::int64_t(1) << 20;
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return "(cannot be opened)";
  std::uint64_t h = 1469598103934665603ull;
  std::vector<char> buf(std::size_t(1) << 20);
  auto hash_from = [&](std::int64_t offset, std::int64_t bytes) {
    if (std::fseek(f.get(), long(offset), SEEK_SET) != 0) return false;
    while (bytes > 0) {
      const std::size_t want = std::size_t(std::min<std::int64_t>(bytes, std::int64_t(buf.size())));
      const std::size_t got = std::fread(buf.data(), 1, want, f.get());
      if (got == 0) return false;
      h = fnv(buf.data(), got, h);
      bytes -= std::int64_t(got);
    }
    return true;
  };
  const bool read = size <= kWhole ? hash_from(0, size) : hash_from(0, kEnds) && hash_from(size - kEnds, kEnds);
  if (!read) return "(cannot be read)";
  return fmt::format("{} bytes, {} {:016x}", size, size <= kWhole ? "hash" : "hash of the first and last MiB", h);
}

// What `path` holds, without its name: a regular file's size and hash; for a directory, its
// regular files' names, sizes and hashes (a checkpoint); nothing is read from other files.
std::string path_key(const std::string& path, const std::string& kind) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "(no such file)";
  if (S_ISREG(st.st_mode)) return content_key(path, std::int64_t(st.st_size));
  if (!S_ISDIR(st.st_mode)) return "(not a regular file)";
  if (kind != "dir") return "(a directory)";
  std::vector<std::string> entries;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(path, ec))
    if (e.is_regular_file(ec)) entries.push_back(e.path().filename().string());
  std::sort(entries.begin(), entries.end());
  std::string listing;
  for (const std::string& name : entries) {
    struct stat fs {};
    const std::string file = path + "/" + name;
    if (::stat(file.c_str(), &fs) == 0) listing += name + " " + content_key(file, std::int64_t(fs.st_size)) + "\n";
  }
  return fmt::format("a directory of {} file(s), hash {:016x}", entries.size(), fnv(listing.data(), listing.size()));
}

// The kind input_path gave `option`, or "" for an option that names no input.
std::string input_kind(CLI::Option* option) {
  for (const char* kind : {"file", "dir", "file-or-list"}) {
    try {
      option->get_validator(std::string(kInputPrefix) + kind);
      return kind;
    } catch (const CLI::OptionNotFound&) {
    }
  }
  return "";
}

// One line of the agreement's text: tabs and newlines escaped, so values cannot break it.
std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else
      out += c;
  }
  return out;
}

std::string shorten(const std::string& s) { return s.size() <= 200 ? s : s.substr(0, 200) + "..."; }

// Collective. Every rank's `text`, or nothing when all ranks hold the same `compared` (then it
// costs one small all-gather of a hash per rank; only a difference moves the texts).
std::vector<std::string> texts_if_different(Communicator& comm, const std::string& compared, const std::string& text) {
  const std::int64_t mine_hash = std::int64_t(fnv(compared.data(), compared.size()));
  const std::vector<std::int64_t> hashes = comm.allgather_value(mine_hash, "validate");
  if (std::all_of(hashes.begin(), hashes.end(), [&](std::int64_t h) { return h == hashes[0]; })) return {};
  std::int64_t longest = std::int64_t(text.size());
  comm.allreduce_max(&longest, 1);
  std::string mine = text;
  mine.resize(std::size_t(longest), '\0');
  std::string all(mine.size() * std::size_t(comm.size()), '\0');
  comm.allgather(mine.data(), all.data(), mine.size(), "validate");
  std::vector<std::string> texts;
  for (int r = 0; r < comm.size(); ++r) {
    std::string t = all.substr(std::size_t(r) * mine.size(), mine.size());
    texts.push_back(t.substr(0, t.find('\0')));
  }
  return texts;
}

// The first rank whose text is not rank 0's.
int first_different(const std::vector<std::string>& texts) {
  int r = 1;
  while (r + 1 < int(texts.size()) && texts[std::size_t(r)] == texts[0]) ++r;
  return r;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::size_t pos = 0;
  for (std::size_t end; (end = text.find(sep, pos)) != std::string::npos; pos = end + 1)
    parts.push_back(text.substr(pos, end - pos));
  parts.push_back(text.substr(pos));
  return parts;
}

std::string parse_outcome(const std::exception_ptr& parse_error) {
  if (!parse_error) return "parses";
  try {
    std::rethrow_exception(parse_error);
  } catch (const CLI::CallForVersion&) {
    return "asks for --version";
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return "asks for --help";
    return fmt::format("fails: {}", e.what());
  }
  return "fails";
}

}  // namespace

CLI::Option* input_path(CLI::Option* option, const std::string& kind) {
  return option->check(CLI::Validator(
      [kind](std::string& path) -> std::string {
        std::error_code ec;
        if (kind != "dir" && std::filesystem::is_directory(path, ec))
          return fmt::format("{} is a directory, not a file", shorten(path));
        return "";
      },
      "", kInputPrefix + kind));
}

const std::vector<std::string>& per_rank_options() {
  // --threads: the default (cores / ranks on the node) already differs between nodes of
  // different sizes, so results never depend on it; a rank may be given its own.
  static const std::vector<std::string> names{"--threads"};
  return names;
}

std::vector<OptionValue> option_values(CLI::App& command) {
  std::vector<OptionValue> values;
  for (CLI::Option* o : command.get_options()) {
    const std::string name = o->get_name();
    if (o == command.get_help_ptr() || o == command.get_help_all_ptr()) continue;
    const auto& skip = per_rank_options();
    if (std::find(skip.begin(), skip.end(), name) != skip.end()) continue;
    std::string value;
    if (o->count() > 0) {
      const std::vector<std::string> given = o->reduced_results();
      for (const std::string& v : given) value += (value.empty() ? "" : " ") + v;
    } else {
      value = !o->get_default_str().empty() ? o->get_default_str()
              : o->get_expected_max() == 0  ? "false"
                                            : "(not given)";
    }
    const std::string kind = input_kind(o);
    std::string key = value;
    if (!kind.empty() && o->count() > 0) {
      std::error_code ec;
      if (kind != "file-or-list" || std::filesystem::exists(value, ec)) key = path_key(value, kind);
    }
    values.push_back({name, key, key == value ? value : fmt::format("{} ({})", value, key)});
  }
  return values;
}

void agree_parse_outcome(Communicator& comm, const std::exception_ptr& parse_error) {
  const std::string outcome = parse_outcome(parse_error);
  const std::vector<std::string> texts = texts_if_different(comm, outcome, outcome);
  if (texts.empty()) return;
  const int r = first_different(texts);
  throw Error(fmt::format("the ranks were given different command lines: rank 0's {}, rank {}'s {}", shorten(texts[0]),
                          r, shorten(texts[std::size_t(r)])));
}

void agree_command_line(Communicator& comm, CLI::App& command) {
  std::string compared = command.get_name(), text = "subcommand\t" + compared + "\t" + compared;
  for (const OptionValue& v : option_values(command)) {
    compared += "\n" + escaped(v.name) + "\t" + escaped(v.key);  // paths aside: only what they hold
    text += "\n" + escaped(v.name) + "\t" + escaped(v.key) + "\t" + escaped(v.shown);
  }
  const std::vector<std::string> texts = texts_if_different(comm, compared, text);
  if (texts.empty()) return;
  const std::vector<std::string> first = split(texts[0], '\n');
  for (int r = 1; r < comm.size(); ++r) {
    const std::vector<std::string> other = split(texts[std::size_t(r)], '\n');
    if (other.size() != first.size())
      throw Error(
          fmt::format("ranks 0 and {} were given different commands: run every rank with the same arguments "
                      "and the same build of ulysses",
                      r));
    for (std::size_t i = 0; i < first.size(); ++i) {
      const std::vector<std::string> a = split(first[i], '\t'), b = split(other[i], '\t');
      if (a.size() != 3 || b.size() != 3 || (a[0] == b[0] && a[1] == b[1])) continue;
      throw Error(fmt::format("ranks were given different {}: rank 0 has {}, rank {} has {}",
                              a[0] == "subcommand" ? "subcommands" : a[0], shorten(a[2]), r, shorten(b[2])));
    }
  }
}

void print_options(CLI::App& command) {
  const auto& per_rank = per_rank_options();
  for (CLI::Option* o : command.get_options()) {
    if (o == command.get_help_ptr() || o == command.get_help_all_ptr()) continue;
    const std::string name = o->get_name();
    const bool agreed = std::find(per_rank.begin(), per_rank.end(), name) == per_rank.end();
    const std::string kind = input_kind(o);
    std::printf("%s %s %s\n", name.c_str(),
                o->get_expected_max() == 0 ? "flag"
                : kind.empty()             ? "value"
                                           : kind.c_str(),
                agreed ? "agreed" : "per-rank");
  }
}

}  // namespace ulysses::cli
