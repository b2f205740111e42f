package levels

import "testing"

// BenchmarkPick measures choosing the level for a Delay-Level value.
func BenchmarkPick(b *testing.B) {
	t := Default()
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := t.Pick(" 3 "); err != nil {
			b.Fatal(err)
		}
	}
}
