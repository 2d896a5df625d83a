// LineReader: lines come back whole and numbered whatever the read boundaries; a line over the
// limit is that line's error (number, length, limit) and the lines after it still come; only
// regular files (or stdin) are read.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "io/line_reader.h"
#include "hostile_util.h"

namespace klinear {
namespace {

struct ReadLine {
  std::string text;
  std::string error;  // the message, empty when ok
};

std::vector<ReadLine> read_all(const std::string& path, int64_t max_line_bytes) {
  auto reader = LineReader::open(path, max_line_bytes);
  EXPECT_TRUE(reader.ok()) << reader.status().to_string();
  std::vector<ReadLine> lines;
  if (!reader.ok()) return lines;
  while (true) {
    auto line = reader->next();
    EXPECT_TRUE(line.ok()) << line.status().to_string();
    if (!line.ok() || !*line) break;
    EXPECT_EQ((*line)->number, static_cast<int64_t>(lines.size()) + 1);
    lines.push_back({(*line)->text, (*line)->error.ok() ? "" : (*line)->error.message()});
  }
  return lines;
}

TEST(LineReader, LinesComeBackWholeAndNumberedAndOverLongOnesAreErrors) {
  const std::string mib(1 << 20, 'x');  // one read's worth: lines cross the read boundaries
  struct Case {
    const char* name;
    std::string text;
    int64_t max_line_bytes;
    std::vector<ReadLine> lines;
  };
  const std::vector<Case> cases = {
      {"empty", "", 10, {}},
      {"one blank line", "\n", 10, {{"", ""}}},
      {"no final newline", "a\nbc", 10, {{"a", ""}, {"bc", ""}}},
      {"blank lines kept", "a\n\n \r\nb\n", 10, {{"a", ""}, {"", ""}, {" \r", ""}, {"b", ""}}},
      {"exactly the limit", "0123456789\n", 10, {{"0123456789", ""}}},
      {"one over", "a\n0123456789X\nb\n", 10,
       {{"a", ""}, {"", "line 2 is 11 bytes long, more than the limit of 10 bytes for one line"}, {"b", ""}}},
      {"over, at the end without a newline", "a\n0123456789X", 10,
       {{"a", ""}, {"", "line 2 is 11 bytes long, more than the limit of 10 bytes for one line"}}},
      {"across read boundaries", "a\n" + mib + mib + "yz\nb\n", 3 << 20, {{"a", ""}, {mib + mib + "yz", ""}, {"b", ""}}},
      {"over across read boundaries", "a\n" + mib + mib + mib + "\nb", (2 << 20) + 5,
       {{"a", ""}, {"", "line 2 is 3145728 bytes long, more than the limit of 2097157 bytes for one line"}, {"b", ""}}},
  };
  for (const Case& c : cases) {
    const testing::ScratchDir dir;
    testing::write_file(dir.file("in"), c.text);
    const std::vector<ReadLine> got = read_all(dir.file("in"), c.max_line_bytes);
    ASSERT_EQ(got.size(), c.lines.size()) << c.name;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].text, c.lines[i].text) << c.name << " line " << i + 1;
      EXPECT_EQ(got[i].error, c.lines[i].error) << c.name << " line " << i + 1;
    }
  }
}

// A line that only ends after a gigabyte is read through to its end (a sparse file: fast, no disk);
// the reader's memory stays the buffer and the limit.
TEST(LineReader, SparseGigabyteLineIsSkippedToItsEnd) {
  const testing::ScratchDir dir;
  const std::string path = dir.file("in");
  testing::write_file(path, "first\n");
  ASSERT_EQ(::truncate(path.c_str(), (1ll << 30) + 6), 0);
  std::ofstream(path, std::ios::app) << "\nlast\n";
  const std::vector<ReadLine> got = read_all(path, 1 << 20);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].text, "first");
  EXPECT_EQ(got[1].error, "line 2 is 1073741824 bytes long, more than the limit of 1048576 bytes for one line");
  EXPECT_EQ(got[2].text, "last");
}

TEST(LineReader, OnlyRegularFilesOrStdin) {
  const testing::ScratchDir dir;
  const auto directory = LineReader::open(dir.str());
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.status().message().find(dir.str() + ": is a directory, expected a regular file"), std::string::npos)
      << directory.status().to_string();
  const auto missing = LineReader::open(dir.file("none"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(dir.file("none") + ": cannot open"), std::string::npos);
  const auto in = LineReader::open("-");
  ASSERT_TRUE(in.ok());
  EXPECT_EQ(in->name(), "stdin");
}

}  // namespace
}  // namespace klinear
