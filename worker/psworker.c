/* psworker.c - one training worker: reads shard K of M of a data set,
 * computes gradients on OpenBLAS and trains against psd with push-and-pull
 * steps through libpsclient (include/psd/client.h), as any other program
 * would. Progress goes to stderr; the last line on stdout is a JSON summary.
 * This file holds main(); the options are in options.c, the training in
 * train.c and train_plan.c, what the worker tells in report.c, the stop
 * signals in stop.c. Calls go one way: main -> options, train ->
 * train_plan, report, stop. */
#include "worker.h"

int main(int argc, char **argv)
{
    wopts o;
    int status = pw_options_parse(argc, argv, &o);
    if (status >= 0)
        return status;
    psc_client *pc = NULL;
    status = pw_client_new(&o, &pc);
    if (status != 0)
        return status;
    return pw_train(&o, pc); /* frees pc */
}
