// Package integration holds delayd's end-to-end tests. They run the real
// router and scanners ([deliver.Service]) against a real embedded
// nats-server with JetStream, never a mock of NATS.
package integration
