// The `lathe` binary: one subcommand per file in this folder (see command.h).

#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/command.h"
#include "core/log.h"

int main(int argc, char** argv) {
    CLI::App app{"lathe: prepare data, train, convert and adapt LLMs on Hopper GPUs, natively."};
    app.set_version_flag("--version", std::string("lathe ") + LATHE_VERSION);
    app.require_subcommand(1);
    bool verbose = false;
    bool quiet = false;
    app.add_flag("-v,--verbose", verbose, "Log debug messages");
    app.add_flag("-q,--quiet", quiet, "Log warnings and errors only");

    lathe::CommandAction action;
    lathe::cli_add_tokenize(app, action);
    lathe::cli_add_tokenizer(app, action);
    lathe::cli_add_prepare(app, action);
    lathe::cli_add_data(app, action);
    lathe::cli_add_chat(app, action);
    lathe::cli_add_train(app, action);
    lathe::cli_add_eval(app, action);
    lathe::cli_add_convert(app, action);
    lathe::cli_add_align(app, action);
    lathe::cli_add_bench(app, action);
    lathe::cli_add_doctor(app, action);

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    lathe::log_set_level(verbose ? lathe::LogLevel::kDebug
                                 : (quiet ? lathe::LogLevel::kWarning : lathe::LogLevel::kInfo));
    if (!action) {
        std::fprintf(stderr, "lathe: no command given; see lathe --help\n");
        return 2;
    }
    const lathe::Status status = action();
    if (!status.ok()) {
        std::fprintf(stderr, "lathe: error: %s\n", status.message().c_str());
        return status.code() == lathe::StatusCode::kInvalidArgument ? 2 : 1;
    }
    return 0;
}
