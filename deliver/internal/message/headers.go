package message

import (
	"strings"
	"time"

	"github.com/delayd/delayd/contract"
)

// Internal headers carried on level-stream messages only. The prefix
// "Delayd-" is reserved: publishers' headers with it are removed at ingress.
const (
	HdrInternalPrefix = contract.InternalHeaderPrefix
	HdrMsgID          = "Delayd-Msg-Id"        // the publisher's Nats-Msg-Id, when it gave one
	HdrIngress        = "Delayd-Ingress"       // derived id "delayd-<ingress created, unix ns>-<ingress seq>"
	HdrOrigin         = "Delayd-Origin"        // a cascading message's first derived id: its delivery id
	HdrHops           = "Delayd-Hops"          // hops so far, decimal
	HdrMoves          = "Delayd-Moves"         // reschedules so far, decimal; absent: none (delivered as Delay-Rescheduled)
	HdrHopDue         = "Delayd-Hop-Due"       // when this level's wait ends, if before Delay-Due-At
	HdrMerge          = "Delayd-Merge"         // the message's merge key, so a hop keeps it
	HdrPartKey        = "Delayd-Partition-Key" // the message's Delay-Partition-Key, so a hop keeps it

	// On a router's epoch marker only (deliver/internal/routing/marker.go).
	HdrRouterEpoch = "Delayd-Router-Epoch" // the router lease's epoch of the term that wrote it, decimal
	HdrRouterTail  = "Delayd-Router-Tail"  // the Delayd-Ingress of the level's last router write before it; absent if none
	HdrRouterLease = "Delayd-Router-Lease" // the lease the epoch is of, "router.<i>"; absent: "router"
)

// Headers JetStream adds to direct-get replies that the scanner reads.
const (
	HdrJSSubject   = "Nats-Subject"
	HdrJSSequence  = "Nats-Sequence"
	HdrJSTimeStamp = "Nats-Time-Stamp"
)

// HasPrefixFold reports whether s starts with prefix, ignoring ASCII case.
func HasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// ParseTime reads an RFC 3339 time as [time.Parse] with [time.RFC3339Nano]
// does, with the same result and error. The form delayd writes
// ([contract.TimeLayout] in UTC, 30 bytes: "2006-01-02T15:04:05.000000000Z")
// is read in place, without time.Parse's general layout walk: the scanner
// reads one or two such times per delivery. Any other form, or a field out
// of range, goes to time.Parse.
func ParseTime(v string) (time.Time, error) {
	if len(v) == len("2006-01-02T15:04:05.000000000Z") && v[4] == '-' && v[7] == '-' && v[10] == 'T' &&
		v[13] == ':' && v[16] == ':' && v[19] == '.' && v[29] == 'Z' {
		year, ok1 := digits(v[0:4])
		month, ok2 := digits(v[5:7])
		day, ok3 := digits(v[8:10])
		hour, ok4 := digits(v[11:13])
		minute, ok5 := digits(v[14:16])
		sec, ok6 := digits(v[17:19])
		nsec, ok7 := digits(v[20:29])
		if ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7 && month >= 1 && month <= 12 && day >= 1 &&
			day <= daysIn(time.Month(month), year) && hour < 24 && minute < 60 && sec < 60 {
			return time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC), nil
		}
	}
	return time.Parse(time.RFC3339Nano, v)
}

// digits reads s, ASCII decimal digits only, as a number.
func digits(s string) (int, bool) {
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i] - '0'
		if c > 9 {
			return 0, false
		}
		n = n*10 + int(c)
	}
	return n, true
}

// daysIn is the number of days in month of year (proleptic Gregorian).
func daysIn(month time.Month, year int) int {
	switch month {
	case time.February:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case time.April, time.June, time.September, time.November:
		return 30
	}
	return 31
}
