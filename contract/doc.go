// Package contract is delayd's wire contract, the part that publishers,
// tools and the service share: header names and their classification,
// subjects (the ingress prefix, delayd's internal subjects and its
// request/reply APIs), the defaults a client must agree on, target
// validation and the target policy, the info API's reply and the cancel
// API's replies. docs/guide.md#publishing, docs/guide.md#cancel and docs/operations.md are
// the prose form of the same contract.
//
// It imports only the standard library, so a publisher's binary that
// imports the root package delayd links none of the service.
package contract
