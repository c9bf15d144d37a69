// Keeps the gRPC library initialized for the rest of the process.
//
// gRPC initializes itself when its first object (server, channel) is made and shuts down when
// the last one goes. That shutdown joins gRPC's executor threads, which may sit in epoll_wait
// for up to 10 s (grpc 1.51): a worker that stops its server, or a test that destroys its last
// server, then hangs that long. An initialization that is never undone means the shutdown never
// runs; the threads end with the process.
#pragma once

namespace omni::rpc {

// Idempotent and thread-safe; StageServer and RemoteStage call it.
void keep_grpc_initialized();

}  // namespace omni::rpc
