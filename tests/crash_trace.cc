// Linked into the multi-process test binaries: a test process that dies of a signal (SIGSEGV,
// SIGABRT, SIGBUS, SIGILL, SIGFPE) prints its stack through glog before it goes, so a crash
// seen once in CI (a third-party library's, UCX's for instance) leaves more than ctest's
// "Exception: SegFault". glog re-raises the signal afterwards: the test still fails as before.
#include <glog/logging.h>

namespace {

struct InstallCrashTrace {
  InstallCrashTrace() { google::InstallFailureSignalHandler(); }
} install_crash_trace;

}  // namespace
