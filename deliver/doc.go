// Package deliver moves delayed messages through delayd: the router reads
// the ingress stream and writes each message to its level stream, and one
// scanner per level stream (its level owner, deliver/internal/level) waits
// for the head's due time and hands due messages to their target subject.
//
// The design follows RocketMQ 4's ScheduleMessageService: every message in a
// level has the same delay, so ingress order is due order and a scanner only
// ever looks at its stream's head. No timer, sorted set or in-memory state is
// kept per pending message, so a backlog costs disk, not memory.
//
// Subjects and streams (see docs/operations.md#jetstream-resources):
//
//	<prefix>.<target>               DELAYD_INGRESS   (work-queue; where publishers write)
//	delayd.level.<NAME>.<target>    DELAYD_<NAME>    (one stream per level, NAME from levels.DurationName)
//	delayd.level.<NAME>.delayd.router.epoch          (in DELAYD_<NAME>: the routers' epoch markers, never delivered)
//	delayd.dlq.<reason>             DELAYD_DLQ       (invalid or undeliverable messages)
//
// A [Service] wires the router, the scanners and the JetStream resources
// together; cmd/delayd runs one.
package deliver
