// Package index is delayd's id index: where each pending message is, by id
// and by merge key, in the stream [Stream] ("DELAYD_INDEX"), and the cancel
// tombstones of [CancelStream] ("DELAYD_CANCELS"). It owns their wire
// formats (the [Record] and [Tombstone] codecs), the keys, the slot
// subjects, the batching of index writes ([Group]), lookups ([Lookup]),
// stream creation ([EnsureStreams]) and trims ([Trim]). Which component
// writes, looks up and trims when is deliver's business (docs/guide.md#cancel,
// docs/operations.md#state-in-nats-missing-garbled-from-another-table).
//
// Cancel and merge need "where is the message with this id (or merge key)
// now" without per-message memory in delayd or in the server. The router
// keeps one small record per level-stream placement in [Stream], on one of
// [Slots] subjects chosen by a hash of the key, so the server tracks a
// bounded set of subjects whatever the backlog (a subject per id would cost
// about 200 bytes of server memory per pending message). The router packs
// the records of up to [GroupMax] placements into one message per slot (an
// index write per message cost a third of the ingest rate). A lookup reads
// only its slot's messages; the latest record for a key is the message's
// current placement (a cascading message gets a new record at every hop).
// Records are written only once their level write is stored, and stored
// before the ingress message is acked, so once the router has passed an
// ingress sequence, its record is readable, and a level write the server
// refused (a stale router's) left none. The
// service purges records older than the oldest head any level had a while
// ago ([Trim]), so the index holds about the longest level's wait of
// records, on disk.
//
// Every I/O call takes a [context.Context] first. Records and tombstones
// are values; a [Group] is written by one goroutine and waited on by
// others (its doc says which).
package index
