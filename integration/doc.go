// Package integration holds delayd's end-to-end tests. They run the real
// router and scanners ([deliver.Service]) against a real embedded
// nats-server with JetStream, never a mock of NATS. This package holds the
// tests of one delayd (in process or as one OS process); the multi-replica
// and multi-node tests are in integration/cluster, a test binary of its own,
// and the harness both use is integration/internal/itest.
package integration
