// klinear: command-line entry point. Each subcommand lives in its own cmd_*.cc file.
#include <cstdio>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"klinear: inference for the Kimi Linear and Kimi K3 model families"};
  app.require_subcommand(1);
  int exit_code = 0;
  klinear::cli::add_model_commands(app, exit_code);
  klinear::cli::add_tokenize_commands(app, exit_code);
  klinear::cli::add_render_commands(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; any malformed command line is bad input (2).
    return app.exit(e) == 0 ? 0 : 2;
  }
  return exit_code;
}
