// Package resource holds the state delayd keeps in NATS besides the id
// index (deliver/internal/index), the offsets (offsets) and the hop secret
// (deliver/internal/hop): it creates the JetStream resources at start
// ([Setup]: the ingress stream with its partition transform, the dead
// letters, the id index and kept answers, the level streams, the offsets
// and lease buckets), and records each level's partition boundaries
// (docs/operations.md#partitions-for-hot-levels).
package resource
