// klinear: command-line entry point. Each subcommand lives in its own cmd_*.cc file.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"klinear: inference for the Kimi Linear and Kimi K3 model families"};
  app.set_version_flag("--version", std::string("klinear ") + KLINEAR_VERSION);
  app.require_subcommand(1);
  int exit_code = 0;
  klinear::cli::add_model_commands(app, exit_code);
  klinear::cli::add_tokenize_commands(app, exit_code);
  klinear::cli::add_render_commands(app, exit_code);
  klinear::cli::add_serve_commands(app, exit_code);
  klinear::cli::add_kda_commands(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; any malformed command line is bad input (2).
    exit_code = app.exit(e) == 0 ? 0 : 2;
  }
  // Output that did not reach its destination (a full disk, a closed stdout or pipe) is a
  // failure even when the command itself succeeded.
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    if (exit_code != 0) return exit_code;  // the command has already said what failed
    std::fprintf(stderr, "klinear: writing standard output failed: %s\n",
                 errno != 0 ? std::strerror(errno) : "write error");
    return 1;
  }
  return exit_code;
}
