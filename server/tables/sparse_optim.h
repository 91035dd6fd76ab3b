/* sparse_optim.h - the optimizers of embedding tables (PROTOCOL.md 13.4):
 * one step of SGD, AdaGrad, lazy Adam or FTRL-proximal on one row.
 *
 * A row is laid out as the row store keeps it (server/tables/table.h): its
 * dim weights, then its optimizer state, ps_topt_state_per_value(opt) x dim
 * float32 values (adagrad: the accumulator; adam: m then v; ftrl: z then
 * n), then, for adam, a uint32 step count. The functions know nothing of
 * keys, tables or modes; they read and write one row. */
#ifndef SRV_SPARSE_OPTIM_H
#define SRV_SPARSE_OPTIM_H

#include <stdint.h>

#include "proto/table.h"

/* Float32 slots of one row: weights, state and (adam) the step count. */
uint32_t srv_sparse_row_floats(const ps_table_def *d);

/* Writes a fresh row of key into row (srv_sparse_row_floats(d) values):
 * its initial weights (PROTOCOL.md 13.3), its state at its start (0, or
 * adagrad's iacc; ftrl's weights are 0 whatever rinit) and step 0. */
void srv_sparse_row_new(const ps_table_def *d, uint64_t key, float *row);

/* One step of d's optimizer on row with the gradient g (d->dim values),
 * scaled by `scale` first (BSP's 1 / workers; 1 otherwise), in place.
 * Computes in double precision and stores float32 (adagrad: in float32
 * throughout, as PyTorch). Returns 1 with the row
 * updated when every new weight and state value is finite, 0 with the row
 * left as it was (not one value written) when one is not. row and g must
 * not overlap. Touches nothing but the row: callers may step different
 * rows from several threads at once. */
int srv_sparse_step(const ps_table_def *d, float *row, const float *g, double scale);

/* srv_sparse_step on rows[k] with the gradient g + k x d->dim, k = 0 ..
 * n - 1 in turn (rows[k] NULL: none). Returns n when every step was
 * finite; else the first k whose step was not: rows[0..k) stepped, rows[k]
 * and after as they were. One loop over the rows, so that the steps of
 * different rows overlap in the CPU instead of waiting one for the other. */
uint32_t srv_sparse_step_rows(const ps_table_def *d, float *const *rows, const float *g, uint32_t n, double scale);

/* srv_sparse_step_rows with every row written, finite or not: 1 when
 * every new value was finite, else 0, and then the rows may hold values
 * that are not (the caller puts them back; the row store keeps an undo
 * copy of each row a push steps). For SGD and AdaGrad of dim 8, 16, 32
 * or 64 it checks the values once for all the rows, not row by row. */
int srv_sparse_step_all(const ps_table_def *d, float *const *rows, const float *g, uint32_t n, double scale);

/* The step count of an adam row (0 for the other optimizers). */
uint32_t srv_sparse_row_step(const ps_table_def *d, const float *row);

#endif
