// Package level is the level owner: one per level stream, the [Level] that
// reads the stream in sequence order from its committed offset, waits for
// the head's due time, hands each due message to its target (or its next
// level) and commits the offset once the hand-offs are confirmed, run by
// the replica that holds the stream's lease for each term of it
// (docs/reshape.md#2-the-level-owner-per-lease-term); other goroutines ask
// it through [Asker]. Semantics follow RocketMQ 4's ScheduleMessageService
// DeliverDelayedMessageTimerTask, except that delayd waits for the head's
// due time instead of rechecking every 100 ms, and commits after every
// confirmed window instead of every 10 s.
package level
