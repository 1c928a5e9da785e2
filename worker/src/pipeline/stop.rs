//! Stop strings across token boundaries: text that could be the start of a
//! stop string is held back until it is known not to be one.

/// What one push released.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// Text safe to emit (never includes a stop string or what follows it).
    pub text: String,
    /// A stop string was found: the text ends just before it.
    pub stopped: bool,
}

/// Scans streamed text for the request's stop strings.
#[derive(Debug, Default)]
pub struct StopScanner {
    stops: Vec<String>,
    held: String,
}

impl StopScanner {
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> Scan {
        if self.stops.is_empty() {
            return Scan {
                text: text.to_owned(),
                stopped: false,
            };
        }
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            let text = self.held[..at].to_owned();
            self.held.clear();
            return Scan {
                text,
                stopped: true,
            };
        }
        let keep = self.partial_suffix();
        let cut = self.held.len() - keep;
        let text = self.held[..cut].to_owned();
        self.held.drain(..cut);
        Scan {
            text,
            stopped: false,
        }
    }

    /// The held text, once the stream ended without a stop.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of
    /// some stop string (on a character boundary).
    fn partial_suffix(&self) -> usize {
        let held = self.held.as_str();
        let mut best = 0;
        for stop in &self.stops {
            let max = stop.len().saturating_sub(1).min(held.len());
            for k in (best + 1..=max).rev() {
                let start = held.len() - k;
                if held.is_char_boundary(start) && stop.starts_with(&held[start..]) {
                    best = k;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut s = StopScanner::new(&stops);
        let mut out = String::new();
        for p in pieces {
            let scan = s.push(p);
            out.push_str(&scan.text);
            if scan.stopped {
                return (out, true);
            }
        }
        out.push_str(&s.flush());
        (out, false)
    }

    #[test]
    fn a_stop_split_across_tokens_ends_the_text_before_it() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "D and more"]),
            ("hello ".into(), true)
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
    }

    #[test]
    fn a_false_start_is_released() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "x"]),
            ("hello ENx".into(), false)
        );
        assert_eq!(run(&["END"], &["EN"]), ("EN".into(), false));
    }

    #[test]
    fn the_earliest_of_several_stops_wins() {
        assert_eq!(run(&["b", "a"], &["xxab"]), ("xx".into(), true));
        assert_eq!(run(&[], &["abc"]), ("abc".into(), false));
    }

    #[test]
    fn multibyte_text_is_held_on_char_boundaries() {
        assert_eq!(run(&["日本"], &["x日", "本y"]), ("x".into(), true));
        assert_eq!(run(&["é!"], &["aé", "b"]), ("aéb".into(), false));
    }
}
