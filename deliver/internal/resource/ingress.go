package resource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/levels"
)

// IngressSubjects prefixes the subjects DELAYD_INGRESS stores its messages
// under when ingress is partitioned: "delayd.in.<partition>.<target>".
const IngressSubjects = "delayd.in."

// IngressPartitionSubject returns "delayd.in.<i>.", the prefix of the
// stored subjects of ingress partition i.
func IngressPartitionSubject(i int) string { return IngressSubjects + strconv.Itoa(i) + "." }

// IngressTransform returns DELAYD_INGRESS's subject transform for n
// ingress partitions: "<prefix>.>" to "delayd.in.{{partition(n)}}.>"; nil
// for n < 2 (not partitioned: subjects are stored as published).
func IngressTransform(prefix string, n int) *jetstream.SubjectTransformConfig {
	if n < 2 {
		return nil
	}
	return &jetstream.SubjectTransformConfig{
		Source:      prefix + ".>",
		Destination: IngressSubjects + "{{partition(" + strconv.Itoa(n) + ")}}.>",
	}
}

// IngressPartitionOf returns the ingress partition the server's transform
// gives a published subject among n: nats-server's partition(n) hashes the
// whole subject (its tokens joined by ".") with FNV-1a 32, mod n, which is
// [levels.PartitionOf].
func IngressPartitionOf(subject string, n int) int { return levels.PartitionOf(subject, n) }

// ingressPartitionsOf returns the ingress partition count a DELAYD_INGRESS
// subject transform was made for by [IngressTransform]: 1 for none, 0 for
// a transform delayd did not make.
func ingressPartitionsOf(tr *jetstream.SubjectTransformConfig) int {
	if tr == nil {
		return 1
	}
	rest, ok := strings.CutPrefix(tr.Destination, IngressSubjects+"{{partition(")
	if !ok {
		return 0
	}
	num, ok := strings.CutSuffix(rest, ")}}.>")
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 2 {
		return 0
	}
	return n
}

// ensureIngress creates or updates DELAYD_INGRESS with the subject
// transform of the configured ingress partition count N (none for N = 1).
// It runs under the setup lease. A change of N while the stream holds
// messages is refused ([ErrIngressPartitionsChanged]): they are stored
// under the old count's subjects. At a change it deletes the routers'
// ingress consumers of the old count (a work queue takes no overlapping
// filters), and moves the messages a publisher stored between its check
// and the update under the old subjects: each is published again under
// the subject it was published to, so the new transform stores it, and
// its old copy deleted (logged: such a message may be routed after a
// later one of its target).
func ensureIngress(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	n := cfg.IngressPartitions
	var checked uint64 // the last sequence while the stream held nothing
	changed := false
	if str, err := js.Stream(ctx, IngressStream); err == nil {
		info := str.CachedInfo()
		if have := ingressPartitionsOf(info.Config.SubjectTransform); have != n {
			if info.State.Msgs > 0 {
				was := strconv.Itoa(have)
				if have == 0 {
					was = "its subject transform " + info.Config.SubjectTransform.Destination
				}
				return fmt.Errorf("DELAYD_INGRESS_PARTITIONS=\"%d\": %w: it holds %d messages stored for DELAYD_INGRESS_PARTITIONS=%s, "+
					"which the routers of %d partitions would not read; start with DELAYD_INGRESS_PARTITIONS=%s until the stream is empty "+
					"(stop the publishers first), then change it", n, ErrIngressPartitionsChanged, info.State.Msgs, was, n, was)
			}
			if err := deleteRouterConsumers(ctx, js); err != nil {
				return err
			}
			checked, changed = info.State.LastSeq, true
			cfg.Logger.Info("ingress partition count changed", slog.Int("from", have), slog.Int("to", n))
			if cfg.Hooks.IngressChanging != nil {
				cfg.Hooks.IngressChanging()
			}
		}
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("stream %s: %w", IngressStream, err)
	}
	str, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:             IngressStream,
		Description:      "delayd ingress: publish to " + cfg.Prefix + ".<target subject> with a Delay-Level header",
		Subjects:         []string{cfg.Prefix + ".>"},
		SubjectTransform: IngressTransform(cfg.Prefix, n),
		Retention:        jetstream.WorkQueuePolicy,
		Storage:          jetstream.FileStorage,
		Replicas:         cfg.Replicas,
		Duplicates:       contract.DuplicateWindow,
	})
	if err != nil {
		return fmt.Errorf("stream %s: %w", IngressStream, err)
	}
	if !changed {
		return nil
	}
	// Every message stored after this info is under the new transform.
	info, err := str.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream %s: %w", IngressStream, err)
	}
	for seq := max(checked+1, info.State.FirstSeq); seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := str.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("stream %s: message %d: %w", IngressStream, seq, err)
		}
		published, ok := oldIngressSubject(cfg.Prefix, n, m.Subject)
		if !ok {
			continue // stored under the new transform
		}
		out := nats.NewMsg(published)
		out.Header, out.Data = m.Header, m.Data
		out.Header.Del(jetstream.MsgIDHeader) // the duplicate window would drop the copy
		if _, err := js.PublishMsg(ctx, out); err != nil {
			return fmt.Errorf("stream %s: move message %d: %w", IngressStream, seq, err)
		}
		if err := str.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("stream %s: delete moved message %d: %w", IngressStream, seq, err)
		}
		cfg.Logger.Warn("ingress message stored under the old ingress partition count while it changed; published again under the new one",
			slog.String("subject", published), slog.Uint64("ingress_seq", seq))
	}
	return nil
}

// oldIngressSubject returns the subject a message stored in DELAYD_INGRESS
// under subject was published to, and true, if subject is not what the
// ingress partition count n stores (prefix is the ingress subject prefix).
func oldIngressSubject(prefix string, n int, subject string) (string, bool) {
	published := subject
	if rest, ok := strings.CutPrefix(subject, IngressSubjects); ok {
		if _, target, ok := strings.Cut(rest, "."); ok {
			published = prefix + "." + target
		}
	}
	if n < 2 {
		return published, published != subject
	}
	return published, subject != IngressPartitionSubject(IngressPartitionOf(published, n))+strings.TrimPrefix(published, prefix+".")
}

// deleteRouterConsumers deletes every router's ingress consumer
// ("delayd-router…") of DELAYD_INGRESS.
func deleteRouterConsumers(ctx context.Context, js jetstream.JetStream) error {
	str, err := js.Stream(ctx, IngressStream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", IngressStream, err)
	}
	lister := str.ConsumerNames(ctx)
	var names []string
	for name := range lister.Name() {
		if strings.HasPrefix(name, RouterConsumer) {
			names = append(names, name)
		}
	}
	if err := lister.Err(); err != nil {
		return fmt.Errorf("list ingress consumers: %w", err)
	}
	for _, name := range names {
		if err := js.DeleteConsumer(ctx, IngressStream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("delete ingress consumer %s: %w", name, err)
		}
	}
	return nil
}
