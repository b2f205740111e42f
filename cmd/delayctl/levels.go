package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/delayd/delayd/levels"
)

// levelSubjects are the subjects of every level stream.
const levelSubjects = "delayd.level.>"

// levelRow is one level stream: a level of the table (index 0 is the immediate level), or a stream left from an
// earlier table.
type levelRow struct {
	Index   *int          `json:"index"` // nil: not in the table
	Delay   time.Duration `json:"-"`
	Stream  string        `json:"stream"`
	Exists  bool          `json:"exists"`
	InTable bool          `json:"in_table"`
	// Precision: a precision level below the table's shortest level (1 ms, 2 ms, 4 ms, ...), through which
	// Delay-Duration and Delay-Deliver-At messages pass their last stretch.
	Precision bool `json:"precision,omitempty"`
	info      *jetstream.StreamInfo
}

// levelRows returns the table's levels (0 first) and then, sorted by delay, the level streams on the server that
// are not in the table: one stream-list request.
func (a *app) levelRows(ctx context.Context) ([]levelRow, time.Time, error) {
	rctx, cancel := a.reqCtx(ctx)
	defer cancel()
	infos := map[string]*jetstream.StreamInfo{}
	var serverNow time.Time
	list := a.js.ListStreams(rctx, jetstream.WithStreamListSubject(levelSubjects))
	for info := range list.Info() {
		infos[info.Config.Name] = info
		if serverNow.IsZero() && !info.TimeStamp.IsZero() {
			serverNow = info.TimeStamp
		}
	}
	if err := list.Err(); err != nil {
		return nil, time.Time{}, fmt.Errorf("list level streams: %w", err)
	}
	if serverNow.IsZero() {
		serverNow = time.Now()
	}
	var rows []levelRow
	seen := map[string]bool{}
	parts := a.cfg.Partitions.WithIngress(a.cfg.IngressPartitions) // every level partitioned with ingress partitions
	for _, l := range append([]levels.Level{{}}, a.cfg.Levels.Levels()...) {
		idx := l.Index
		for _, name := range parts.Streams(l.Delay) { // a partitioned level: a row per partition stream
			info := infos[name]
			rows = append(rows, levelRow{Index: &idx, Delay: l.Delay, Stream: name, Exists: info != nil, InTable: true, info: info})
			seen[name] = true
		}
	}
	for _, l := range a.cfg.Levels.PrecisionLevels() {
		for _, name := range parts.Streams(l.Delay) {
			info := infos[name]
			rows = append(rows, levelRow{Delay: l.Delay, Stream: name, Exists: info != nil, Precision: true, info: info})
			seen[name] = true
		}
	}
	var extra []levelRow
	for name, info := range infos {
		if d, ok := levels.ParseStreamName(name); ok && !seen[name] {
			extra = append(extra, levelRow{Delay: d, Stream: name, Exists: true, info: info})
		}
	}
	slices.SortFunc(extra, func(x, y levelRow) int { return int(x.Delay - y.Delay) })
	return append(rows, extra...), serverNow, nil
}

// markerSubjects are the subjects of the routers' epoch markers in every level stream: empty messages a router writes
// at the start of its term (docs/glossary.md), not messages of a publisher's.
const markerSubjects = "delayd.level.*.delayd.router.epoch"

// levelMessages returns how many messages r's stream holds, the routers' epoch markers not counted: one stream info
// request, filtered to the marker subjects, per stream that holds any message.
func (a *app) levelMessages(ctx context.Context, r levelRow) (uint64, error) {
	if r.info == nil || r.info.State.Msgs == 0 {
		return 0, nil
	}
	rctx, cancel := a.reqCtx(ctx)
	defer cancel()
	s, err := a.js.Stream(rctx, r.Stream)
	if err != nil {
		return 0, fmt.Errorf("level stream %s: %w", r.Stream, err)
	}
	info, err := s.Info(rctx, jetstream.WithSubjectFilter(markerSubjects))
	if err != nil {
		return 0, fmt.Errorf("level stream %s: epoch markers: %w", r.Stream, err)
	}
	var markers uint64
	for _, n := range info.State.Subjects {
		markers += n
	}
	return info.State.Msgs - min(info.State.Msgs, markers), nil
}

func (r levelRow) indexText() string {
	if r.Index == nil {
		return "-"
	}
	return fmt.Sprint(*r.Index)
}

func (r levelRow) delayText() string {
	if r.Index != nil && *r.Index == 0 {
		return "0s (at once)"
	}
	return levels.FormatDuration(r.Delay)
}

func (a *app) levelsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "levels",
		Short: "The level table: index, delay, stream, whether it exists; and level streams left from an earlier table",
		Long: `levels prints the level table (DELAYD_LEVELS or --levels; set it as delayd has it): each level's
index (the Delay-Level header's value; 0 delivers at once), delay, level stream, whether that stream
exists on the server, and the messages it holds (the routers' epoch markers not counted). Level streams on the server that are not in the table (left from an earlier table,
drained by delayd) follow, with index "-".`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := a.requireIngress(cmd.Context()); err != nil {
				return err
			}
			rows, _, err := a.levelRows(cmd.Context())
			if err != nil {
				return err
			}
			msgs := func(r levelRow) (uint64, error) { return a.levelMessages(cmd.Context(), r) }
			if asJSON {
				type out struct {
					levelRow
					Delay    string `json:"delay"`
					Messages uint64 `json:"messages"`
				}
				var outs []out
				for _, r := range rows {
					o := out{levelRow: r, Delay: levels.FormatDuration(r.Delay)}
					if r.info != nil {
						if o.Messages, err = msgs(r); err != nil {
							return err
						}
					}
					outs = append(outs, o)
				}
				return writeJSON(a.stdout, outs)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "LEVEL\tDELAY\tSTREAM\tEXISTS\tMESSAGES\tNOTE")
			for _, r := range rows {
				exists, count, note := "no", "-", ""
				if r.Exists {
					n, err := msgs(r)
					if err != nil {
						return err
					}
					exists, count = "yes", fmt.Sprint(n)
				}
				if r.Precision {
					note = "precision level: the last stretch of Delay-Duration and Delay-Deliver-At messages"
				} else if !r.InTable {
					note = "not in the table: left from an earlier table, drained by delayd"
				} else if !r.Exists {
					note = "missing: delayd creates it at start (is delayd's DELAYD_LEVELS this table?)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.indexText(), r.delayText(), r.Stream, exists, count, note)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// noArgs is cobra.NoArgs with a usage exit code.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return withCode(exitUsage, "%s takes no arguments, got %q", cmd.CommandPath(), strings.Join(args, " "))
	}
	return nil
}

func writeJSON(w interface{ Write([]byte) (int, error) }, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
