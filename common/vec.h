/* vec.h - the float kernels live in proto/vec.h (the tensor codec, at the
 * bottom of the tree, needs them); this header only forwards there, for the
 * files of psd that still include it by this name. New code includes
 * proto/vec.h. */
#ifndef PS_COMMON_VEC_H
#define PS_COMMON_VEC_H

#include "proto/vec.h"

#endif
