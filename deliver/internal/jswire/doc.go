// Package jswire reads JetStream over its wire protocol, below the jetstream
// client package: a pull loop over a core subscription ([Pull]), batched
// direct gets ([BatchReader]) and the metadata of $JS.ACK reply subjects
// ([ParseAck]).
//
// delayd reads at this level for two reasons. It saves the client's
// per-message work on the hot path, and it tells JetStream's own messages from
// a publisher's by what a publisher cannot forge: a data message always has
// a $JS.ACK reply subject and a stored message fetched by direct get always
// has a Nats-Sequence header, while a status message has neither. Client
// code that looks at the Status header instead can be poisoned: an empty
// message with the user headers "Status: 409" and "Description: Consumer
// Deleted" reads as the consumer's deletion. For the same reason replies
// arrive on channel subscriptions: a synchronous subscription's NextMsg turns
// any empty message with "Status: 503" into an error.
//
// Every I/O call takes a [context.Context] first. Each type here is owned by
// one goroutine at a time (its doc says so); none holds a mutex.
package jswire
