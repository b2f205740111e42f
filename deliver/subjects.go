package deliver

import "github.com/delayd/delayd/contract"

// Subject roots of the contract, short for this package's use.
const (
	levelSubjects = contract.LevelSubjectPrefix // "delayd.level.<level name>.<target>"
	dlqSubjects   = contract.DLQSubjectPrefix   // "delayd.dlq.<reason>"
)
