// Debian's libfccp-dev (fast-cpp-csv-parser, header-only), as the project includes it: without its
// reader thread. Its error types copy file names with strncpy into fixed buffers, which GCC flags;
// the truncation is intended. Only the rooms that link its include folder (calibrate/, sim/) use
// this header.
#pragma once

#define CSV_IO_NO_THREAD
#pragma GCC diagnostic push
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wstringop-truncation"
#endif
#include <libfccp/csv.h>
#pragma GCC diagnostic pop
