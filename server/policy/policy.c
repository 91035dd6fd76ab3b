/* policy.c - consistency modes: when a push is applied, when a round closes
 * and when a pull may be answered.
 *   asgd  applies each push as it arrives (optionally scaled by staleness or
 *         delay-compensated, DC-ASGD);
 *   bsp   sums a round's pushes and applies their mean once the live workers
 *         (less backup_workers) have pushed;
 *   ssp   applies pushes as they arrive, but answers a worker's pull only
 *         while it is at most `staleness` clocks ahead of the slowest live
 *         worker.
 * They decide only (policy.h): they get checked pushes, read the clock
 * psd.clock, apply through the update engine (update.h), and return
 * SRV_WAKE when waiting pulls may have become answerable. Each owns its
 * state in psd.policy_state.
 *
 * One file per policy: asgd.c, ssp.c (both apply through apply.c), bsp.c
 * (with bsp_kept.c, bsp_tround.c and bsp_pieces.c). This file picks one and
 * runs the settings' cross-check with the checks of its mode (srv_config_check). */
#include "server/policy/policy.h"

#include "proto/errors.h"

const srv_policy_ops *srv_policy_for(const ps_config *cfg)
{
    return cfg->mode == PS_MODE_BSP   ? &srv_policy_bsp
           : cfg->mode == PS_MODE_SSP ? &srv_policy_ssp
                                      : &srv_policy_asgd;
}

int srv_config_check(const ps_config *c, srv_check_when when, srv_settings *out, char *err, size_t len)
{
    /* the mode's needs first: a setting the mode cannot have is the
     * first thing to say */
    const srv_policy_ops *p = srv_policy_for(c);
    if (p->check && p->check(c, err, len) != 0)
        return PS_EINVAL;
    return srv_settings_check(c, when, out, err, len);
}
