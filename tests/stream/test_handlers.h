/*
 * test_handlers.h -- the stream tests' handlers (test_handlers.c), for the
 * tests' build of the worker (worker.c with TPS_TEST_HANDLERS).
 */
#ifndef TPS_TEST_HANDLERS_H
#define TPS_TEST_HANDLERS_H

#include "tp_stream.h"

/* The handler called `name` (NULL or "": tps_default_handler, as NULL);
 * 0, or -1 for an unknown name. */
int tps_test_handler(const char *name, tps_handler *out);

#endif
