package levels

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Partitions gives some levels of a table a partition count: a level with count P > 1 is P streams, partition i
// named [PartitionStreamName] (delay, i), i = 0 to P-1, instead of one stream [StreamName]. A level not in it, or with
// count 1, has one stream. The zero value partitions nothing.
type Partitions struct {
	counts map[time.Duration]int
}

// ParsePartitions parses a partition list: entries <duration>=<count> separated by whitespace or commas, for example
// "1m=4 5m=2". Each duration has the level-table grammar ([ParseDuration]); each count is 1 to [PartitionsMax]; no
// delay appears twice ("1m=2 60s=4" names 1m twice). "" is no partitions. Errors wrap [ErrBadPartitions] and name
// the entry. It does not check the delays against a table: see [Partitions.Check].
func ParsePartitions(text string) (Partitions, error) {
	entries := strings.FieldsFunc(text, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' || r == '\r' })
	p := Partitions{}
	for _, e := range entries {
		durText, countText, ok := strings.Cut(e, "=")
		if !ok {
			return Partitions{}, fmt.Errorf("levels: partitions entry %q: want <level delay>=<count>, e.g. 1m=4: %w", e, ErrBadPartitions)
		}
		d, reason := parseDuration(durText)
		if reason == "" {
			reason = checkDelay(d)
		}
		if reason != "" {
			return Partitions{}, fmt.Errorf("levels: partitions entry %q: delay %q: %s: %w", e, durText, reason, ErrBadPartitions)
		}
		n, err := strconv.Atoi(countText)
		if err != nil || n < 1 || n > PartitionsMax {
			return Partitions{}, fmt.Errorf("levels: partitions entry %q: count %q: want an integer from 1 to %d: %w", e, countText, PartitionsMax, ErrBadPartitions)
		}
		if _, dup := p.counts[d]; dup {
			return Partitions{}, fmt.Errorf("levels: partitions entry %q: level %s is given twice: %w", e, FormatDuration(d), ErrBadPartitions)
		}
		if p.counts == nil {
			p.counts = make(map[time.Duration]int)
		}
		p.counts[d] = n
	}
	return p, nil
}

// Decode parses text with [ParsePartitions] into p, so that github.com/kelseyhightower/envconfig can read it. On
// error p is left unchanged.
func (p *Partitions) Decode(text string) error {
	parsed, err := ParsePartitions(text)
	if err != nil {
		return err
	}
	*p = parsed
	return nil
}

// Check returns an error wrapping [ErrBadPartitions] if p names a delay that is not a level of t (the immediate
// level and the precision levels cannot be partitioned); nil otherwise.
func (p Partitions) Check(t Table) error {
	for _, d := range p.delays() {
		if !slices.Contains(t.delays, d) {
			return fmt.Errorf("levels: partitions: %s is not a level of the table %q: %w", FormatDuration(d), t.String(), ErrBadPartitions)
		}
	}
	return nil
}

// Count returns the partition count of the level of delay d: 1 if it is not partitioned.
func (p Partitions) Count(d time.Duration) int {
	if n := p.counts[d]; n > 1 {
		return n
	}
	return 1
}

// Streams returns the names of the streams of the level of delay d: [StreamName] (d) alone if it has one partition,
// else [PartitionStreamName] (d, i) for i = 0 to [Partitions.Count] - 1.
func (p Partitions) Streams(d time.Duration) []string {
	n := p.Count(d)
	if n == 1 {
		return []string{StreamName(d)}
	}
	out := make([]string, n)
	for i := range out {
		out[i] = PartitionStreamName(d, i)
	}
	return out
}

// String returns the canonical list: entries with a count above 1, by increasing delay, in [FormatDuration] form,
// separated by single spaces ("1m=4 5m=2"); "" for none. Two lists that partition alike have the same String.
func (p Partitions) String() string {
	var b strings.Builder
	for _, d := range p.delays() {
		if p.counts[d] < 2 {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", FormatDuration(d), p.counts[d])
	}
	return b.String()
}

func (p Partitions) delays() []time.Duration {
	ds := make([]time.Duration, 0, len(p.counts))
	for d := range p.counts {
		ds = append(ds, d)
	}
	slices.Sort(ds)
	return ds
}

// PartitionOf returns the partition, 0 to n-1, of a partition key among n partitions: FNV-1a 32 of the key's bytes,
// mod n. The hash is fixed, so every replica and every version of delayd maps a key to the same partition. n < 2 is
// partition 0.
func PartitionOf(key string, n int) int {
	if n < 2 {
		return 0
	}
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}
