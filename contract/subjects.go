package contract

import "time"

// PrefixDefault is the default ingress subject prefix (DELAYD_PREFIX):
// publishers write to "delay.<target subject>".
const PrefixDefault = "delay"

// MaxDelayDefault is the default longest Delay-Duration, or Delay-Deliver-At
// ahead of the ingress store time, that delayd accepts (DELAYD_MAX_DELAY):
// a week. A longer one is dead-lettered with reason "level".
const MaxDelayDefault = 168 * time.Hour

// DuplicateWindow is the Nats-Msg-Id duplicate window of delayd's ingress
// and dead-letter streams (JetStream's own default), which delayd sets on
// every start: a message published with an id that one of them stored
// within the window is dropped as a duplicate, and nothing is stored.
const DuplicateWindow = 2 * time.Minute

// CancelShareDefault is the default share of one core's time the cancel
// API's id-index lookups may take (DELAYD_CANCEL_SHARE): a tenth. Past it,
// cancel requests are answered busy (docs/guarantees.md#what-a-cancel-costs).
const CancelShareDefault = 0.1

// Internal subject space. Every subject delayd itself uses lives under
// [InternalPrefix]; a target there is refused ([ErrForbiddenTarget]).
const (
	// InternalPrefix is the root of delayd's internal subjects, "delayd".
	InternalPrefix = "delayd"

	// LevelSubjectPrefix starts every level stream's subjects:
	// "delayd.level.<level name>.<target>", e.g. "delayd.level.5S.orders.close".
	LevelSubjectPrefix = InternalPrefix + ".level."

	// DLQSubjectPrefix starts the dead-letter subjects; the last token is
	// the reason: "delayd.dlq.level", "delayd.dlq.target", ...
	DLQSubjectPrefix = InternalPrefix + ".dlq."

	// CancelSubject is the unscoped cancel API (NATS request/reply), the
	// operator's form: the request's payload is a message id of any target,
	// the reply one of the Cancel* texts with a [HeaderStatus] code.
	// Publishers use the scoped form [CancelSubjectFor], which server
	// permissions can limit by target.
	CancelSubject = InternalPrefix + ".api.cancel"

	// InfoSubject is the info API (NATS request/reply): any request is
	// answered with an [InfoReply] as JSON.
	InfoSubject = InternalPrefix + ".api.info"

	// StatsSubject is the stats API (NATS request/reply): any request is
	// answered with the service's counters as JSON (deliver.StatsReply).
	// delayctl's stats and watch commands read the process counters here.
	StatsSubject = InternalPrefix + ".api.stats"

	// DecideSubjectPrefix starts the decide subjects, internal to delayd
	// and no user contract: "delayd.api.decide.<level stream>"
	// ([DecideSubject]). Only delayd's own user needs them; its
	// subscribe permission on "delayd.api.>" covers them.
	DecideSubjectPrefix = InternalPrefix + ".api.decide."
)

// DecideSubject returns the decide subject of a level stream,
// "delayd.api.decide.<stream>" (e.g. "delayd.api.decide.DELAYD_5S"): the
// delayd replica that owns the stream (holds its lease) serves it, for the
// decisions only the owner may make (a cancel of one of the stream's
// messages, the router's merge check). It is internal to delayd: the
// request and reply formats are not a user contract and may change
// between versions.
func DecideSubject(stream string) string { return DecideSubjectPrefix + stream }

// CancelSubjectFor returns the scoped cancel API subject of target,
// "delayd.api.cancel.<target>": a request there cancels only a message
// whose target subject is target, and answers "not found" for any other,
// so a NATS user allowed to publish to "delayd.api.cancel.orders.>" can
// cancel only messages bound for orders.>.
func CancelSubjectFor(target string) string { return CancelSubject + "." + target }
