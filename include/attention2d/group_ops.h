/* attention2d: the plain C table of a process group's operations (group_comm.hpp says what
 * each one does and who fills it). C, so that a module built with another C++ ABI (a torch
 * extension) and the engine's module share no C++ type. */
#ifndef ATTENTION2D_GROUP_OPS_H
#define ATTENTION2D_GROUP_OPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// The version of the table below; a module built for another refuses to mix.
#define A2D_GROUP_OPS_ABI 1

// Every operation posts and returns a work handle, or returns null and writes its error text
// into error[0, error_bytes) (NUL-terminated). wait() completes a handle and frees it: 0, or -1
// with the error text. Byte counts are int64; ranks are the group's.
typedef struct A2dGroupOps {
  uint32_t abi;
  void* group;   // the group (opaque); released by release(group) once nothing uses it
  int32_t rank;  // this process's rank in the group
  int32_t size;
  char backend[32];  // "gloo", "nccl", ...: for messages
  void* (*send)(void* group, const void* data, int64_t bytes, int32_t peer, int32_t tag,
                char* error, int64_t error_bytes);
  void* (*recv)(void* group, void* data, int64_t bytes, int32_t peer, int32_t tag, char* error,
                int64_t error_bytes);
  // Block i of send (send_bytes[i]) to rank i, block j of recv (recv_bytes[j]) from rank j.
  void* (*all_to_all)(void* group, const void* send, const int64_t* send_bytes, void* recv,
                      const int64_t* recv_bytes, char* error, int64_t error_bytes);
  // Every rank's `bytes` bytes, in rank order, into recv (size * bytes).
  void* (*all_gather)(void* group, const void* send, void* recv, int64_t bytes, char* error,
                      int64_t error_bytes);
  // element: 0 float32, 1 float64, 2 int64; maximum: 0 sum, 1 max. In place.
  void* (*all_reduce)(void* group, void* data, int64_t count, int32_t element, int32_t maximum,
                      char* error, int64_t error_bytes);
  void* (*broadcast)(void* group, void* data, int64_t bytes, int32_t root, char* error,
                     int64_t error_bytes);
  void* (*barrier)(void* group, char* error, int64_t error_bytes);
  int32_t (*wait)(void* work, char* error, int64_t error_bytes);
  void (*release)(void* group);
} A2dGroupOps;

#ifdef __cplusplus
}
#endif

#endif
