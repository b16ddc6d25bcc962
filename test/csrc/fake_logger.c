/*
 * fake_logger.c - a stand-in for ncclDebugLog, built as a shared object
 * named like the host library (librccl.so.1 / libnccl.so.2) so that the
 * plugin's dladdr-based flavor detection can be tested.
 */
#include <stdarg.h>
#include <stdio.h>

static int last_level = -1;
static char last_msg[1024];
static int warn_lines_nccl, warn_lines_rccl;

void fake_logger(int level, unsigned long flags, const char* file, int line, const char* fmt,
                 ...) {
  (void)flags;
  (void)file;
  (void)line;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_msg, sizeof last_msg, fmt, ap);
  va_end(ap);
  last_level = level;
  if (level == 2) warn_lines_nccl++;
  if (level == 3) warn_lines_rccl++;
}

int fake_last_level(void) { return last_level; }
const char* fake_last_msg(void) { return last_msg; }
