// Package routing is the router: the one writer of the level streams. A
// [Router] consumes DELAYD_INGRESS, classifies each message (a pure
// classifier), writes it to its level stream in ingress order, or to
// DELAYD_DLQ with the reason when it is invalid, writes the id index, and
// acks the ingress message once the write is stored. It runs for each term
// of its lease ([Router.RunTerm]): each term syncs every level stream's
// tail and writes its epoch marker there before writing it
// (docs/design.md#the-routers-start-level-by-level). It asks the level
// owners only through [Owners]; it does not import the level owner's
// package, nor does that package import it (docs/design.md#layout).
package routing
