// Package itest is the harness shared by delayd's end-to-end test packages
// (integration: one delayd, integration/cluster: several replicas and
// nats-server clusters): a [Bundle] of a real embedded nats-server, a client
// and a delayd service, delayd run as an OS process ([Bundle.StartProcess],
// built once per test binary by [DelaydBinary]), delayctl runs ([Delayctl]),
// subscribers that record deliveries ([Collector], [Recorder]) with the
// invariant checks (never early, nothing lost, no duplicates, offsets only
// forward), and a TCP [Proxy] that cuts or stalls a client's connection.
// Never a mock of NATS. It is imported only by tests.
package itest
