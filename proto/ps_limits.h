/* ps_limits.h - hard protocol limits. A peer can never make a psd program exceed
 * these, whatever it declares; the configurable limits (max_frame, ...) sit
 * below them. */
#ifndef PS_LIMITS_H
#define PS_LIMITS_H

#define PS_PROTO_VERSION 1

#define PS_FRAME_HDR 4u                        /* big-endian u32 payload length */
#define PS_FRAME_MAX_HARD (2048u * 1024 * 1024 - 1) /* largest payload ever */
#define PS_FRAME_MAX_PREAUTH (512u * 1024)     /* largest payload before the handshake: a hello with
                                                * the largest layout (PS_TENSORS_MAX) fits */
#define PS_PARAMS_MAX (1ULL << 34)             /* largest flat parameter vector */
#define PS_MSG_DEPTH_MAX 6                     /* deepest nesting of arrays/maps */
#define PS_MSG_OBJECTS_MAX 65536               /* most msgpack objects in one frame */
#define PS_DATA_ALIGN 4                        /* tensors are float-aligned in frames */
/* Clients (psworker, psbench) split tensors over PS_CHUNK_FLOATS into chunks
 * of that many floats (4 MiB; psd keeps the model in blocks of the same
 * size). They send a push's chunks back to back and keep PS_PULL_WINDOW
 * chunk pulls in flight: the next chunk is on the wire while this one is
 * read, and psd holds at most that many chunks' blocks for one client. */
#define PS_CHUNK_FLOATS (1u << 20)
#define PS_PULL_WINDOW 2

#endif
