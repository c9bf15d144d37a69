// vllm-omni: the command line (worker/cli/app.h has the subcommands).
#include "worker/cli/app.h"

int main(int argc, char** argv) { return omni::cli::main(argc, argv); }
