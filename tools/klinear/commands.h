// The klinear subcommands. Each cmd_<name>.cc registers its subcommands on the app; its callback
// runs after parsing and stores the process exit code in `exit_code` (0 ok, 1 runtime error,
// 2 bad input). Commands print errors as "klinear <cmd>: <Status>" on stderr and never throw.
#pragma once

#include <CLI/CLI.hpp>

namespace klinear::cli {

void add_model_commands(CLI::App& app, int& exit_code);     // logits, generate, chat, info, init
void add_tokenize_commands(CLI::App& app, int& exit_code);  // tokenize, detokenize
void add_render_commands(CLI::App& app, int& exit_code);    // render
void add_serve_commands(CLI::App& app, int& exit_code);     // serve, run, bench-serve
void add_kda_commands(CLI::App& app, int& exit_code);       // kda

}  // namespace klinear::cli
