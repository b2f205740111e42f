package levels_test

import (
	"fmt"
	"time"

	"github.com/delayd/delayd/levels"
)

func ExampleTable_Pick() {
	table := levels.MustParse("1s 5s 1m30s")
	for _, value := range []string{"0", " 2 ", "3", "9", "-1", ""} {
		lvl, clamped, err := table.Pick(value)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Printf("%q: level %d, delay %v, stream %s, clamped %v\n", value, lvl.Index, lvl.Delay, lvl.Stream(), clamped)
	}
	// Output:
	// "0": level 0, delay 0s, stream DELAYD_0S, clamped false
	// " 2 ": level 2, delay 5s, stream DELAYD_5S, clamped false
	// "3": level 3, delay 1m30s, stream DELAYD_1M30S, clamped false
	// "9": level 3, delay 1m30s, stream DELAYD_1M30S, clamped true
	// levels: "-1": negative (want 0 to 3; higher values are clamped): invalid delay level
	// levels: "": empty value (want 0 to 3; higher values are clamped): missing delay level
}

func ExampleParse() {
	table, err := levels.Parse("1s 90s 1d")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(table)
	for _, lvl := range table.Levels() {
		fmt.Println(lvl.Index, lvl.Stream())
	}

	_, err = levels.Parse("1s 5s 1x")
	fmt.Println(err)
	// Output:
	// 1s 1m30s 24h
	// 1 DELAYD_1S
	// 2 DELAYD_1M30S
	// 3 DELAYD_24H
	// levels: "1x" (level 3): unknown unit "x" (want ms, s, m, h or d): bad duration
}

func ExampleParsePartitions() {
	table := levels.MustParse("1s 1m 5m")
	parts, err := levels.ParsePartitions("1m=4, 5m=2")
	if err == nil {
		err = parts.Check(table)
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(parts)
	fmt.Println(parts.Streams(time.Minute))
	fmt.Println(parts.Streams(time.Second))
	// The partition of a key (a Delay-Partition-Key, or the target subject): FNV-1a 32 of its bytes mod the count.
	fmt.Println(levels.PartitionOf("orders.eu", 4), levels.PartitionOf("orders.us", 4), levels.PartitionOf("user-42", 4))

	_, err = levels.ParsePartitions("1m=4 60s=2")
	fmt.Println(err)
	// Output:
	// 1m=4 5m=2
	// [DELAYD_1M-P0 DELAYD_1M-P1 DELAYD_1M-P2 DELAYD_1M-P3]
	// [DELAYD_1S]
	// 0 2 3
	// levels: partitions entry "60s=2": level 1m is given twice: bad partitions
}
