// Runs a Python oracle script of tests/chat (jinja2 for K2, tiktoken for K3) on a JSON input file
// and reads its JSON output. The scripts take `ARGS... INPUT OUTPUT` and exit 3 when their Python
// package is missing; both are required, so a missing one fails the test with what to install.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "io/json.h"
#include "test_util.h"

namespace klinear::testing {

// `python3 tests/chat/SCRIPT ARGS INPUT OUTPUT` with `input` written to INPUT; the parsed OUTPUT.
// `install` says how to get the script's package (shown when it is missing).
inline Result<Json> run_python_oracle(const std::string& script, const std::string& args, const Json& input,
                                      const std::string& install) {
  ScratchDir dir;
  const std::string in = dir.file("in.json"), out = dir.file("out.json"), err_path = dir.file("err.txt");
  std::ofstream(in) << input.dump(-1, ' ', false, Json::error_handler_t::strict);
  const std::string cmd = "python3 '" + source_path("tests/chat/" + script) + "' " + args + " '" + in + "' '" + out +
                          "' 2>'" + err_path + "'";
  const int status = std::system(cmd.c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  Result<std::string> err_text = read_text_file(err_path);
  const std::string err = err_text.ok() ? err_text.value() : "";
  if (code == 127) return Status::NotFound(script + " needs python3 on PATH and " + install + ". " + err);
  if (code == 3) return Status::NotFound(script + ": " + install + ". " + err);
  if (code != 0) return Status::IOError(script + " exited with " + std::to_string(code) + ": " + err);
  return read_json_file(out);
}

}  // namespace klinear::testing
