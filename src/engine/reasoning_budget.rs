//! A budget on a thinking model's reasoning, as llama.cpp's reasoning-budget sampler keeps it:
//! once the reasoning opens (its start tag generated, or left open by the prompt), at most
//! `tokens` tokens are its; then the closing tag (after an optional message) is forced, token
//! by token, and the model answers. A reasoning block the model closes itself ends the count;
//! a new one gets a fresh budget.
//!
//! Tags are matched as token sequences at the end of the history, as llama.cpp matches them.
//! This file only decides which token is forced; [`super::Sequence`] applies it.

/// The budget and the token sequences it watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReasoningBudget {
    /// Tokens the reasoning may take before it is closed.
    pub tokens: usize,
    /// The tokens that open a reasoning block (`<think>`).
    pub start: Vec<u32>,
    /// The tokens that close one (`</think>`).
    pub end: Vec<u32>,
    /// What is forced when the budget is spent: the message, if any, then `end`.
    pub forced: Vec<u32>,
    /// The prompt left a reasoning block open: the count starts with the first token.
    pub opened: bool,
}

impl ReasoningBudget {
    /// A budget of `tokens` for a template's reasoning tags (`opened`: the prompt ends inside
    /// them), `message` forced before the closing tag, all tokenized as llama.cpp tokenizes
    /// them (control-token text parsed, no BOS).
    pub fn for_tags(
        tokenizer: &crate::tokenizer::Tokenizer,
        tags: crate::template::reasoning::ThinkTags,
        opened: bool,
        tokens: usize,
        message: &str,
    ) -> Self {
        let encode = |text: &str| tokenizer.encode(text, false, true);
        let end = encode(tags.close);
        let mut forced = if message.is_empty() {
            Vec::new()
        } else {
            encode(message)
        };
        forced.extend(&end);
        ReasoningBudget {
            tokens,
            start: encode(tags.open),
            end,
            forced,
            opened,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Outside reasoning, watching for its start.
    Idle,
    /// Inside, with this many tokens left.
    Counting(usize),
    /// Forcing `forced[at]` next.
    Forcing(usize),
    /// The block closed: watching for another start.
    Done,
}

/// The budget as a generation spends it.
#[derive(Clone, Debug)]
pub struct BudgetTracker {
    budget: ReasoningBudget,
    state: State,
}

impl BudgetTracker {
    pub fn new(budget: ReasoningBudget) -> Self {
        let state = if budget.opened {
            Self::opened(&budget)
        } else {
            State::Idle
        };
        BudgetTracker { budget, state }
    }

    fn opened(budget: &ReasoningBudget) -> State {
        if budget.tokens == 0 {
            State::Forcing(0)
        } else {
            State::Counting(budget.tokens)
        }
    }

    /// The token the next step must take, while the closing tag is forced.
    pub fn forced(&self) -> Option<u32> {
        match self.state {
            State::Forcing(at) => self.budget.forced.get(at).copied(),
            _ => None,
        }
    }

    /// The history's last token was just accepted.
    pub fn accept(&mut self, history: &[u32]) {
        let ends_with = |tags: &[u32]| !tags.is_empty() && history.ends_with(tags);
        self.state = match self.state {
            State::Idle | State::Done if ends_with(&self.budget.start) => Self::opened(&self.budget),
            State::Idle => State::Idle,
            State::Done => State::Done,
            State::Counting(_) if ends_with(&self.budget.end) => State::Done,
            State::Counting(left) if left <= 1 => self.forcing_after(history),
            State::Counting(left) => State::Counting(left - 1),
            State::Forcing(at) if at + 1 >= self.budget.forced.len() => State::Done,
            State::Forcing(at) => State::Forcing(at + 1),
        };
    }

    /// Forcing, from where the history leaves off: when the model has already written the
    /// start of what is forced (the first token of a closing tag of several), the rest only.
    fn forcing_after(&self, history: &[u32]) -> State {
        let forced = &self.budget.forced;
        let written = (1..forced.len())
            .rev()
            .find(|&k| history.ends_with(&forced[..k]))
            .unwrap_or(0);
        State::Forcing(written)
    }

    /// Whether the next token is forced (so not the model's, nor a grammar's, choice).
    pub fn forcing(&self) -> bool {
        matches!(self.state, State::Forcing(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: u32 = 100;
    const END: u32 = 101;

    fn budget(tokens: usize, opened: bool) -> ReasoningBudget {
        ReasoningBudget {
            tokens,
            start: vec![START],
            end: vec![END],
            forced: vec![7, END],
            opened,
        }
    }

    /// Runs `model` (what the model would choose) through the tracker; returns what was taken.
    fn run(budget: ReasoningBudget, model: &[u32]) -> Vec<u32> {
        let mut tracker = BudgetTracker::new(budget);
        let mut history = vec![1, 2];
        let mut taken = Vec::new();
        let mut wanted = model.iter();
        while let Some(token) = tracker.forced().or_else(|| wanted.next().copied()) {
            history.push(token);
            taken.push(token);
            tracker.accept(&history);
        }
        taken
    }

    #[test]
    fn after_the_budget_the_message_and_closing_tag_are_forced_then_the_model_answers() {
        // Opened by the model: three tokens of reasoning, then 7 and the end tag forced.
        assert_eq!(
            run(budget(3, false), &[5, START, 10, 11, 12, 13, 14]),
            [5, START, 10, 11, 12, 7, END, 13, 14]
        );
        // Opened by the prompt: the count starts at once.
        assert_eq!(run(budget(2, true), &[10, 11, 12]), [10, 11, 7, END, 12]);
        // A zero budget closes an opened block before any reasoning.
        assert_eq!(run(budget(0, true), &[10, 11]), [7, END, 10, 11]);
    }

    #[test]
    fn a_block_the_model_closes_within_budget_is_left_alone_and_a_new_one_counts_afresh() {
        assert_eq!(
            run(budget(3, false), &[START, 10, END, 11, 12, 13]),
            [START, 10, END, 11, 12, 13]
        );
        assert_eq!(
            run(budget(2, false), &[START, 10, END, START, 20, 21, 22]),
            [START, 10, END, START, 20, 21, 7, END, 22]
        );
    }

    #[test]
    fn a_closing_tag_the_model_has_begun_when_the_budget_ends_is_finished_not_repeated() {
        let b = ReasoningBudget {
            tokens: 3,
            start: vec![START],
            end: vec![60, 61],
            forced: vec![60, 61],
            opened: true,
        };
        // The third reasoning token is the tag's first: only its second is forced.
        assert_eq!(run(b, &[10, 11, 60, 12]), [10, 11, 60, 61, 12]);
    }

    #[test]
    fn tags_of_several_tokens_are_matched_whole() {
        let b = ReasoningBudget {
            tokens: 1,
            start: vec![50, 51],
            end: vec![60, 61],
            forced: vec![60, 61],
            opened: false,
        };
        // 51 alone is no start; 50 51 is.
        assert_eq!(run(b.clone(), &[51, 9, 9]), [51, 9, 9]);
        assert_eq!(run(b, &[50, 51, 9, 9]), [50, 51, 9, 60, 61, 9]);
    }
}
