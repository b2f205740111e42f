package message

import (
	"strings"

	"github.com/delayd/delayd/contract"
)

// markerTarget is the target of a router's epoch marker in a level stream
// (deliver/internal/routing/marker.go).
const markerTarget = contract.InternalPrefix + ".router.epoch"

// IsMarker reports whether subject, a level stream's message subject, is a
// marker subject: "delayd.level.<level name>.delayd.router.epoch" exactly
// (a target such as "x.delayd.router.epoch" is not).
func IsMarker(subject string) bool {
	rest, ok := strings.CutPrefix(subject, contract.LevelSubjectPrefix)
	if !ok {
		return false
	}
	_, target, ok := strings.Cut(rest, ".")
	return ok && target == markerTarget
}
