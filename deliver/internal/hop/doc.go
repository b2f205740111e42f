// Package hop holds the hop secret (the hop-key entry of the offsets
// bucket) and everything it signs: the MAC that lets a cascading message's
// Delayd-* headers be trusted when it re-enters the ingress stream, the hop
// ids that dedupe its moves, and the delivery ids of messages without a
// publisher id (docs/operations.md#the-hop-secret).
package hop
