package deliver

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/levels"
)

// InfoSubject is the info API (NATS request/reply): any request is answered
// with an [InfoReply] as JSON, the configuration a publisher's client needs
// to check a message the way this delayd's router will (delayd.Publish,
// delayctl pub). The service subscribes before it reports ready.
const InfoSubject = "delayd.api.info"

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
	// cascading messages use ([levels.Table.PrecisionLevels]); no publisher
	// names them.
	PrecisionLevels []InfoLevel `json:"precision_levels"`
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

// Info returns the service's [InfoReply].
func (s *Service) Info() InfoReply {
	maxDelay := cmp.Or(s.cfg.MaxDelay, MaxDelayDefault)
	r := InfoReply{
		Version:         version(),
		Prefix:          s.cfg.Prefix,
		Levels:          infoLevels(s.cfg.Levels.Levels()),
		PrecisionLevels: infoLevels(s.cfg.Levels.PrecisionLevels()),
		MaxDelay:        maxDelay.String(),
		MaxDelayNS:      int64(maxDelay),
		AllowTargets:    append([]string{}, s.cfg.Targets.Allow...),
		DenyTargets:     append([]string{}, s.cfg.Targets.Deny...),
		MaxPayload:      s.nc.MaxPayload(),
		HeaderReserve:   HeaderReserve,
	}
	return r
}

func infoLevels(ls []levels.Level) []InfoLevel {
	out := make([]InfoLevel, 0, len(ls))
	for _, l := range ls {
		out = append(out, InfoLevel{Level: l.Index, Delay: l.Delay.String(), DelayNS: int64(l.Delay), Stream: l.Stream()})
	}
	return out
}

// version is the binary's module version, with its VCS revision if known.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && s.Value != "" {
			v += " " + s.Value[:min(12, len(s.Value))]
		}
	}
	return v
}

// subscribeInfo answers [InfoSubject] requests with the service's
// [InfoReply] and waits until the server has the subscription.
func (s *Service) subscribeInfo(ctx context.Context) (*nats.Subscription, error) {
	b, err := json.Marshal(s.Info())
	if err != nil { // cannot happen: strings and numbers
		return nil, fmt.Errorf("info API: encode reply: %w", err)
	}
	sub, err := s.nc.Subscribe(InfoSubject, func(m *nats.Msg) {
		if m.Reply == "" {
			return
		}
		if err := m.Respond(b); err != nil {
			s.logger.Warn("info API: reply failed", slog.Any("error", err))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", InfoSubject, err)
	}
	fctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err := s.nc.FlushWithContext(fctx); err != nil {
		s.logger.Warn("info API subscription not confirmed yet", slog.Any("error", err))
	}
	return sub, nil
}
