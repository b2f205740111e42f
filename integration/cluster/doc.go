// Package cluster holds delayd's multi-replica and multi-node end-to-end
// tests: several delayd processes (replicas) on one nats-server or on a
// JetStream cluster of nats-server processes, killed, paused, cut off and
// restarted under load. It is a test binary of its own, apart from the
// single-process tests in package integration, so each stays well within
// go test's default timeout. The shared harness is integration/internal/itest.
package cluster
