package deliver

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/levels"
)

// Info returns the service's [contract.InfoReply].
func (s *Service) Info() contract.InfoReply {
	maxDelay := cmp.Or(s.cfg.MaxDelay, contract.MaxDelayDefault)
	r := contract.InfoReply{
		Version:         version(),
		Prefix:          s.cfg.Prefix,
		Levels:          infoLevels(s.cfg.Levels.Levels()),
		PrecisionLevels: infoLevels(s.cfg.Levels.PrecisionLevels()),
		Partitions:      s.cfg.Partitions.String(),
		MaxDelay:        maxDelay.String(),
		MaxDelayNS:      int64(maxDelay),
		AllowTargets:    append([]string{}, s.cfg.Targets.Allow...),
		DenyTargets:     append([]string{}, s.cfg.Targets.Deny...),
		MaxPayload:      s.nc.MaxPayload(),
		HeaderReserve:   contract.HeaderReserve,
	}
	return r
}

func infoLevels(ls []levels.Level) []contract.InfoLevel {
	out := make([]contract.InfoLevel, 0, len(ls))
	for _, l := range ls {
		out = append(out, contract.InfoLevel{Level: l.Index, Delay: l.Delay.String(), DelayNS: int64(l.Delay), Stream: l.Stream()})
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

// subscribeInfo answers [contract.InfoSubject] requests with the service's
// [contract.InfoReply] and waits until the server has the subscription.
// Run unsubscribes once it has stopped everything else.
func (s *Service) subscribeInfo(ctx context.Context) (*nats.Subscription, error) {
	b, err := json.Marshal(s.Info())
	if err != nil { // cannot happen: strings and numbers
		return nil, fmt.Errorf("info API: encode reply: %w", err)
	}
	sub, err := s.nc.Subscribe(contract.InfoSubject, func(m *nats.Msg) {
		if m.Reply == "" {
			return
		}
		if err := m.Respond(b); err != nil {
			s.logger.Warn("info API: reply failed", slog.Any("error", err))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", contract.InfoSubject, err)
	}
	fctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	defer cancel()
	if err := s.nc.FlushWithContext(fctx); err != nil {
		s.logger.Warn("info API subscription not confirmed yet", slog.Any("error", err))
	}
	return sub, nil
}

// precisionSetting is DELAYD_PRECISION's value for a level table: "on"
// with precision levels, "off" without ([levels.Table.WithoutPrecision]).
func precisionSetting(t levels.Table) string {
	if t.Precision() {
		return "on"
	}
	return "off"
}
