// Package target holds the target bindings (deliver's TargetIndex): which
// target subjects a stream captures, so a delivery is confirmed by a PubAck
// (stream-bound) or by a flush (core), and which subjects the server
// refused delayd's publishes to.
package target
