// The `lathe` binary: one subcommand per file in this folder (see command.h).

#include <cxxabi.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <new>
#include <string>
#include <typeinfo>

#include "cli/command.h"
#include "core/log.h"

namespace {

// "std::out_of_range" for an exception of that type (the compiler's mangled name when the runtime
// cannot demangle it).
std::string exception_type_name(const std::exception& e) {
    const char* mangled = typeid(e).name();
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> name(
        abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
    return status == 0 && name ? std::string(name.get()) : std::string(mangled);
}

// The exit code of an error: 2 for bad input (as CLI11 uses for a bad command line), 1 otherwise.
int report_error(lathe::StatusCode code, const std::string& message) {
    std::fprintf(stderr, "lathe: error: %s\n", message.c_str());
    return code == lathe::StatusCode::kInvalidArgument ? 2 : 1;
}

int run(int argc, char** argv) {
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
    lathe::cli_add_generate(app, action);
    lathe::cli_add_serve(app, action);
    lathe::cli_add_convert(app, action);
    lathe::cli_add_align(app, action);
    lathe::cli_add_bench(app, action);
    lathe::cli_add_doctor(app, action);
    lathe::cli_add_runs(app, action);
    lathe::cli_add_report(app, action);
    lathe::cli_add_launch(app, action);

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        // --help and --version end here too, with success; a bad argument is an invalid-argument
        // error like any other: one `lathe: error:` line and exit code 2.
        if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
        return report_error(lathe::StatusCode::kInvalidArgument,
                            std::string(e.what()) + " (--help lists the options)");
    }
    lathe::log_set_level(verbose ? lathe::LogLevel::kDebug
                                 : (quiet ? lathe::LogLevel::kWarning : lathe::LogLevel::kInfo));
    if (!action) {
        return report_error(lathe::StatusCode::kInvalidArgument,
                            "no command given; see lathe --help");
    }
    const lathe::Status status = action();
    if (!status.ok()) return report_error(status.code(), status.message());
    return 0;
}

}  // namespace

// Library code reports expected failures as a Status; an exception reaching here is a failure no
// Status described (memory exhausted, a library throwing on input it was not expected to see). It
// still ends as one error line and a non-zero exit, never as std::terminate.
int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::bad_alloc&) {
        return report_error(
            lathe::StatusCode::kInternal,
            "out of memory (a memory allocation failed); free memory, or make the job smaller (a "
            "smaller batch, sequence length, model or thread count)");
    } catch (const std::filesystem::filesystem_error& e) {
        return report_error(lathe::StatusCode::kIoError, fmt::format("file system: {}", e.what()));
    } catch (const std::exception& e) {
        return report_error(
            lathe::StatusCode::kInternal,
            fmt::format(
                "unexpected failure: {} ({}); please report it with the command that gave it",
                e.what(), exception_type_name(e)));
    } catch (...) {
        return report_error(lathe::StatusCode::kInternal,
                            "unexpected failure of an unknown kind; please report it with the "
                            "command that gave it");
    }
}
