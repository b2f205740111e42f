// Package message holds the level message and the dead letter: the internal
// Delayd-* headers a level-stream message carries, its index key and due
// time, the derived ingress reference, the dead-letter message with its
// reasons and counters, and the invalid-input and undeliverable sentinels
// (docs/reshape.md#12-files-what-moves-where-from-filefunction-today).
package message
