package deliver

import (
	"strconv"
	"time"
)

// sharedSettings are the settings every live replica must share, by the
// variable that sets each: they decide which streams exist and how. The
// answer variables set DELAYD_ANSWERS' MaxAge and MaxBytes, which each
// replica's setup writes: two values would rewrite the stream back and
// forth at each start.
func (s *Service) sharedSettings() map[string]string {
	return map[string]string{
		"DELAYD_LEVELS":     s.cfg.Levels.String(),
		"DELAYD_PRECISION":  precisionSetting(s.cfg.Levels),
		"DELAYD_PARTITIONS": s.partitionsSetting,

		"DELAYD_ANSWER_KEEP":      answerKeepSetting(s.cfg.AnswerKeep),
		"DELAYD_ANSWER_MAX_BYTES": strconv.FormatInt(s.cfg.AnswerMaxBytes, 10),

		"DELAYD_INGRESS_PARTITIONS": strconv.Itoa(s.cfg.IngressPartitions),
		"DELAYD_PREFIX":             s.cfg.Prefix,
		"DELAYD_REPLICAS":           strconv.Itoa(s.cfg.Replicas),
	}
}

// answerKeepSetting is DELAYD_ANSWER_KEEP as the shared settings give it:
// "off" for [AnswerKeepOff], else the Go duration.
func answerKeepSetting(keep time.Duration) string {
	if keep == AnswerKeepOff {
		return "off"
	}
	return keep.String()
}
