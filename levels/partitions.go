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
// count 1, has one stream, unless ingress is partitioned ([Partitions.WithIngress]): then every level, the immediate
// and precision levels too, has at least the ingress partition count. The zero value partitions nothing.
type Partitions struct {
	counts  map[time.Duration]int
	ingress int // ingress partitions N: a level's count is a multiple of it; 0 or 1: not partitioned
}

// WithIngress returns p for n ingress partitions (DELAYD_INGRESS_PARTITIONS): a level without a count above 1 in p,
// the immediate and precision levels included, gets count n; a level's count must be a multiple of n
// ([Partitions.Check]), so that each of its streams is written by one router: partition j by router j mod n
// ([Partitions.Router]). n < 2 is p unchanged (one router).
func (p Partitions) WithIngress(n int) Partitions {
	p.ingress = max(n, 1)
	return p
}

// Ingress returns the ingress partition count p was given by [Partitions.WithIngress]: 1 if none.
func (p Partitions) Ingress() int { return max(p.ingress, 1) }

// Router returns the ingress partition, 0 to [Partitions.Ingress]-1, whose router writes partition j of a level:
// j mod the ingress count.
func (p Partitions) Router(j int) int { return j % p.Ingress() }

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
// level and the precision levels cannot be given a count), or, with ingress partitions ([Partitions.WithIngress]),
// gives a level a count above 1 that is not a multiple of the ingress count; nil otherwise.
func (p Partitions) Check(t Table) error {
	for _, d := range p.delays() {
		if !slices.Contains(t.delays, d) {
			return fmt.Errorf("levels: partitions: %s is not a level of the table %q: %w", FormatDuration(d), t.String(), ErrBadPartitions)
		}
		if n := p.counts[d]; n > 1 && n%p.Ingress() != 0 {
			return fmt.Errorf("levels: partitions: %s=%d: the count is not a multiple of the %d ingress partitions (each level stream has one router): %w",
				FormatDuration(d), n, p.Ingress(), ErrBadPartitions)
		}
	}
	return nil
}

// Count returns the partition count of the level of delay d: its count in p if above 1, else the ingress count
// ([Partitions.Ingress]: 1 if ingress is not partitioned).
func (p Partitions) Count(d time.Duration) int {
	if n := p.counts[d]; n > 1 {
		return n
	}
	return p.Ingress()
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
// separated by single spaces ("1m=4 5m=2"); "" for none. Two lists that partition alike have the same String. The
// ingress count is not part of it.
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
