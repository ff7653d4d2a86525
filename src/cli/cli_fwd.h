// Forward declarations of CLI11's App and Option for the CLI's headers. Only the files
// that declare flags include <CLI/CLI.hpp>: every file that includes it compiles CLI11's
// validators again, seconds of build time each.
#pragma once

namespace CLI {
class App;
class Option;
}  // namespace CLI
