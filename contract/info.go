package contract

// HeaderReserve is the most bytes of headers delayd adds to a message on
// its way through (level-stream headers, cascade headers and their MAC, the
// delivery's Nats-Msg-Id), beyond the publisher's own headers and payload.
// A message whose headers and payload take more than the server's max
// payload less HeaderReserve may be dead-lettered with reason "size";
// clients refuse it up front.
const HeaderReserve = 1024

// InfoReply is the info API's reply: this delayd's configuration.
type InfoReply struct {
	// Version is delayd's module version and VCS revision, when the binary
	// carries them ("(devel)" for go run).
	Version string `json:"version"`
	// Prefix is the ingress subject prefix (DELAYD_PREFIX): publish to
	// "<prefix>.<target>".
	Prefix string `json:"prefix"`
	// Levels is the level table (DELAYD_LEVELS), level 1 first: a
	// Delay-Level above the last is clamped to it (RocketMQ semantics).
	Levels []InfoLevel `json:"levels"`
	// PrecisionLevels are the levels below the table's shortest, which only
	// cascading messages use (levels.Table.PrecisionLevels); no publisher
	// names them.
	PrecisionLevels []InfoLevel `json:"precision_levels"`
	// Partitions is the partition list (DELAYD_PARTITIONS) in canonical
	// form, "1m=4 5m=2": level 1m's messages are in streams DELAYD_1M-P0 to
	// DELAYD_1M-P3 instead of its InfoLevel.Stream. Absent: none.
	Partitions string `json:"partitions,omitempty"`
	// MaxDelay is the longest Delay-Duration, or Delay-Deliver-At ahead of
	// the ingress store time, accepted (DELAYD_MAX_DELAY), in Go's duration
	// form; MaxDelayNS is the same in nanoseconds.
	MaxDelay   string `json:"max_delay"`
	MaxDelayNS int64  `json:"max_delay_ns"`
	// AllowTargets and DenyTargets are the target policy's subject patterns
	// (DELAYD_ALLOW_TARGETS, DELAYD_DENY_TARGETS); empty lists allow every
	// target the contract allows.
	AllowTargets []string `json:"allow_targets"`
	DenyTargets  []string `json:"deny_targets"`
	// MaxPayload is the server's max payload in bytes as delayd's
	// connection sees it, and HeaderReserve [HeaderReserve]: a message's
	// headers and payload must take at most MaxPayload - HeaderReserve.
	MaxPayload    int64 `json:"max_payload"`
	HeaderReserve int   `json:"header_reserve"`
}

// InfoLevel is one level in an [InfoReply].
type InfoLevel struct {
	// Level is the Delay-Level value that names it (1-based); precision
	// levels continue after the table's last.
	Level int `json:"level"`
	// Delay is the level's delay in Go's duration form, DelayNS the same in
	// nanoseconds.
	Delay   string `json:"delay"`
	DelayNS int64  `json:"delay_ns"`
	// Stream is the level's stream, e.g. "DELAYD_5S".
	Stream string `json:"stream"`
}
