/* snapshot.c - a follower's snapshot (PROTOCOL.md 17): what a checkpoint
 * holds, written by the checkpoint's forked writer (checkpoint.c) into a
 * descriptor the caller gives (dispatch/repl.c's memory file), with no file,
 * rename or pruning, and the caller told when it is done. */
#include "server/report/checkpoint.h"
#include "server/report/ckpt_job.h"
#include "server/update/update.h"
#include "server/update/tapply.h"

#include "proto/errors.h"

int srv_checkpoint_snapshot(psd *s, int fd, void (*done)(psd *s, int rc, uint64_t version, void *arg), void *arg,
                            char *err, size_t errlen)
{
    if (srv_update_busy(s) || srv_ckpt_mid_round(s))
        return ps_fail(err, errlen, PS_ENOT_READY, "an update is being applied: ask again");
    srv_tapply_drain(s->tapply);
    ckpt_job *j = srv_ckpt_job_new(s);
    if (!j)
        return ps_fail(err, errlen, PS_ENOMEM, "no memory for a snapshot");
    j->out_fd = fd;
    j->snap_done = done;
    j->snap_arg = arg;
    if (srv_ckpt_job_fork(s, j) != 0) {
        int rc = ps_fail(err, errlen, PS_EIO, "%s", j->err);
        srv_ckpt_job_free(j);
        return rc;
    }
    return 0;
}
